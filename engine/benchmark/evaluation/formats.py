"""The versions of Tulving's published file formats, and the check every reader makes.

Each format carries a "MAJOR.MINOR" version and ships a JSON Schema
(engine/benchmark/evaluation/schemas/, also in docs/schemas/):

    format     key in the file       now    schema
    results    results_version       2.1    results-line.schema.json  (one line of results.jsonl)
    scores     scores_version        1.0    scores.schema.json        (scores.json)
    run        run_version           1.0    run.schema.json           (run.json)
    bundle     bundle_version        1.0    bundle.schema.json        (tulving bundle)

A minor version adds optional keys and nothing else: a reader reads every
minor of its major (keys it does not know are ignored). A major version
changes what a figure means (the prompts, the scoring) or the shape: a
reader refuses a file of another major with one line. Files written before
the version keys existed read as: results lines without `results_version`
1 (refused: other prompts), `results_version: 2` (an integer) 2.0, scores.json
and run.json without a version 1.0.
"""
from __future__ import annotations

import json
from functools import cache
from importlib import resources

from providers.base import JSONObject, TulvingError

# format -> (the version written now, the key it is written under, the version of a file without the key)
VERSIONS: dict[str, tuple[str, str, str]] = {
    "results": ("2.1", "results_version", "1.0"),
    "scores": ("1.0", "scores_version", "1.0"),
    "run": ("1.0", "run_version", "1.0"),
    "bundle": ("1.0", "bundle_version", "1.0"),
}
SCHEMA_FILES = {"results": "results-line.schema.json", "scores": "scores.schema.json", "run": "run.schema.json",
                "bundle": "bundle.schema.json"}
_WHY_OLD = {"results": "written with other prompts or scoring: run the evaluation again"}


class FormatVersionError(TulvingError):
    """A file of a major version this Tulving does not read."""


def parse_version(value: object) -> tuple[int, int] | None:
    """(major, minor) of a version value: 2 -> (2, 0), "2.1" -> (2, 1); None when not a version."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, 0) if value >= 0 else None
    if isinstance(value, str):
        major, dot, minor = value.partition(".")
        if major.isdigit() and (not dot or minor.isdigit()):
            return int(major), int(minor or 0)
    return None


def current(kind: str) -> str:
    """The version this Tulving writes for `kind`."""
    return VERSIONS[kind][0]


def check_version(kind: str, value: object, where: str) -> tuple[int, int]:
    """(major, minor) of a file of `kind` whose version key holds `value`
    (None: the key is absent); one line naming `where` when its major is not
    the one this Tulving reads."""
    written, key, absent = VERSIONS[kind]
    found = parse_version(absent if value is None else value)
    major = int(written.split(".")[0])
    if found is None:
        raise FormatVersionError(f"{where}: {key} {value!r} is not a version (MAJOR.MINOR)")
    if found[0] != major:
        why = (_WHY_OLD.get(kind, "an older format") if found[0] < major
               else "written by a newer Tulving: upgrade tulving-bench to read it")
        raise FormatVersionError(f"{where}: {kind} format version {found[0]}.{found[1]}, this Tulving reads "
                                 f"{major}.x ({why})")
    return found


def stamp(kind: str, data: JSONObject) -> JSONObject:
    """`data` with its version key set to the version written now (the key first)."""
    _, key, _ = VERSIONS[kind]
    return {key: current(kind), **{k: v for k, v in data.items() if k != key}}


@cache
def schema(kind: str) -> dict[str, object]:
    """The JSON Schema of `kind`, as shipped in the package."""
    text = resources.files("engine.benchmark.evaluation").joinpath("schemas", SCHEMA_FILES[kind]).read_text("utf-8")
    loaded: dict[str, object] = json.loads(text)
    return loaded


def schema_problems(kind: str, data: object) -> list[str]:
    """Where `data` breaks the schema of `kind` ("path: message"), [] when it
    follows it. Needs jsonschema (the `test` extra): a validator of the
    published schemas, not a dependency of a run."""
    import jsonschema
    from referencing import Registry, Resource

    # The bundle's schema refers to the other three by their $id.
    registry: Registry = Registry().with_resources(
        (str(schema(k)["$id"]), Resource.from_contents(schema(k))) for k in SCHEMA_FILES)
    validator = jsonschema.Draft202012Validator(schema(kind), registry=registry)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))]
