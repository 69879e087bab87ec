"""The built wheel installed in a fresh virtual environment, once per test
session (tests/test_install.py, tests/test_main_job.py and
tests/test_memory_adapters_cli.py read it; conftest.py registers the fixture):

    tulving, work = installed      # the fresh venv's `tulving` script, a working folder outside the checkout

The fresh environment gets Tulving only from the wheel (`--no-deps`); its
third-party dependencies come from this test environment's site-packages
through a .pth file (a .pth line adds a path but does not run the .pth files
found there, so the checkout's editable install stays invisible). The tests
only read the environment; what they write goes to folders of their own (or
to `work`, each under its own name).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TULVING_DATA", "TULVING_CONFIG", "TULVING_CACHE", "VIRTUAL_ENV")}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's `tulving` script, a working folder outside the checkout)."""
    root = tmp_path_factory.mktemp("user")
    # Built from a copy of the sources, so that a stale build/ folder of the
    # checkout cannot slip old files into the wheel.
    src = root / "src"
    src.mkdir()
    for name in ("engine", "providers", "cache"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("tulving_bench.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    wheels = root / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(src)],
                 cwd=root, env=_clean_env())
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("tulving_bench-*.whl")
    venv = root / "venv"
    # Without pip of its own (ensurepip is most of a venv's making): this pip installs into it.
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root, env=_clean_env())
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root, env=_clean_env()).stdout.strip())
    (site / "deps_from_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                 "--no-index", str(wheel)], cwd=root, env=_clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    work = root / "work"
    work.mkdir()
    return venv / "bin" / "tulving", work
