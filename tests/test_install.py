"""Installed as a user installs it: the built wheel in a fresh virtual
environment in a temporary folder outside the checkout, no TULVING_DATA, no
../shared reachable, run from a folder of its own.

The fresh environment gets Tulving only from the wheel (`--no-deps`); its
third-party dependencies come from this test environment's site-packages
through a .pth file (a .pth line adds a path but does not run the .pth files
found there, so the checkout's editable install stays invisible). That keeps
the test offline and quick while every Tulving file comes from the wheel.
"""
from __future__ import annotations

from pathlib import Path

from tests.wheel_install import REPO, _clean_env, _run


def test_the_wheel_carries_code_and_data_and_nothing_comes_from_the_checkout(installed):
    tulving, work = installed
    python = tulving.parent / "python"
    probe = _run([str(python), "-c", "import engine, providers, cache, engine.benchmark.datadir as d; "
                                     "print(engine.__file__); print(cache.__file__); print(d.data_dir())"],
                 cwd=work, env=_clean_env())
    assert probe.returncode == 0, probe.stderr
    venv = tulving.parents[1]
    for line in probe.stdout.splitlines():
        assert Path(line).is_relative_to(venv), line
        assert not Path(line).is_relative_to(REPO), line


def test_the_wheel_carries_the_shipped_embedding_vectors(installed):
    tulving, work = installed
    probe = _run([str(tulving.parent / "python"), "-c",
                  "from providers import embed_table as t; print(t.TABLE_PATH); print(len(t.load().rows))"],
                 cwd=work, env=_clean_env())
    assert probe.returncode == 0, probe.stderr
    path, rows = probe.stdout.split()
    assert Path(path).is_relative_to(tulving.parents[1]) and int(rows) > 0


def test_questions_from_the_installed_package(installed):
    tulving, work = installed
    done = _run([str(tulving), "questions", "--book", "synaptic-echoes", "--out", "q.jsonl"], cwd=work,
                env=_clean_env())
    assert done.returncode == 0, done.stderr
    assert len((work / "q.jsonl").read_text().splitlines()) == 686


# The README's `tulving run` from the installed package, every part of it (the built-in reader in
# context and by RAG, MiniLM, SmolLM2's sample, the built-in judge): tests/test_main_job.py, which runs
# it once for both (a fresh home, as a newcomer), with this test's assertions.


def test_every_command_module_is_part_of_the_installed_cli(installed):
    tulving, work = installed
    done = _run([str(tulving), "--help"], cwd=work, env=_clean_env())
    assert done.returncode == 0, done.stderr
    for command in ("cache", "generate", "run", "questions", "report", "models"):
        assert f"    {command}" in done.stdout, command


def test_a_shadowing_cache_package_stops_the_command_with_one_line(installed, tmp_path):
    tulving, work = installed
    shadow = tmp_path / "shadow"
    (shadow / "cache").mkdir(parents=True)
    (shadow / "cache" / "__init__.py").write_text("# caching for humans\n")
    info = shadow / "cache-1.0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cache\nVersion: 1.0.3\n")
    (info / "RECORD").write_text("cache/__init__.py,,\ncache-1.0.3.dist-info/METADATA,,\n")
    done = _run([str(tulving), "models"], cwd=work, env=_clean_env(PYTHONPATH=str(shadow)))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "package 'cache'" in lines[0] and "'cache 1.0.3'" in lines[0] and "pipx install tulving-bench" in lines[0]
    assert "Traceback" not in done.stderr
