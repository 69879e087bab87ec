"""The `tulving` command's entry point: check the install, then run the CLI.

Tulving's code lives in three top-level packages, `engine`, `providers` and
`cache` (the design's layout). PyPI has unrelated distributions that install
packages under the same names (`cache`, `providers`); with one of them in the
environment, `import cache` would silently load the wrong code. So before
anything of Tulving is imported, each of the three names must resolve to the
folder beside this file (the same in a wheel install and an editable one);
otherwise the command stops with one line naming the culprit.

Standard library only: this module must work whatever else is broken.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

DISTRIBUTION = "tulving-bench"
OWN_PACKAGES = ("engine", "providers", "cache")
HOME = Path(__file__).resolve().parent


def _owner(origin: Path) -> str | None:
    """The installed distribution whose files include `origin`, if any."""
    import importlib.metadata  # only when something is wrong: it is slow to import

    for dist in importlib.metadata.distributions():
        for file in dist.files or ():
            if file.name == origin.name and file.parent.name == origin.parent.name:
                try:
                    if Path(str(dist.locate_file(file))).resolve() == origin:
                        return f"{dist.metadata['Name']} {dist.version}"
                except (OSError, ValueError):
                    continue
    return None


def shadowing_problem() -> str | None:
    """One line naming the first of Tulving's packages that resolves to files
    of another distribution (or is missing), or None when all are Tulving's."""
    for name in OWN_PACKAGES:
        expected = HOME / name / "__init__.py"
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin == expected:
            continue
        if origin is None:
            return (f"Tulving's package {name!r} cannot be found (expected {expected.parent}): "
                    f"reinstall {DISTRIBUTION}")
        owner = _owner(origin)
        culprit = f"distribution {owner!r}" if owner else "another package"
        return (f"package {name!r} resolves to {origin.parent} ({culprit}), which shadows Tulving's "
                f"{expected.parent}: install Tulving in its own virtual environment "
                f"(e.g. `pipx install {DISTRIBUTION}`)")
    return None


def main() -> int:
    problem = shadowing_problem()
    if problem is not None:
        print(f"tulving: error: {problem}", file=sys.stderr)
        return 2
    from engine.cli.main import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
