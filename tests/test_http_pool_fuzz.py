"""A short bounded run of benchmarks/fuzz_http_reply.py with each engine: the
pool's reply parsing answers every mutated server reply with a reply or one of
its documented errors (the script exits 1 on anything else). The script
itself is checked to catch a planted bug, so a fuzzer that cannot fail
would fail here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "fuzz_http_reply.py"


def fuzz(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("engine", ["random", "atheris"])
def test_a_bounded_fuzz_run_finds_nothing(engine, tmp_path):
    # A bound in inputs, not seconds: the same inputs however loaded the machine is.
    result = fuzz(tmp_path, "--engine", engine, "--runs", "5000", "--seed", "7")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    if engine == "random":
        assert "random engine: 5,000 inputs in a bound of 5,000 inputs (seed 7), no failure" in result.stdout
    else:
        runs = [line for line in result.stderr.splitlines() if line.startswith("stat::number_of_executed_units")]
        assert runs and int(runs[0].split(":")[-1]) == 5000
    assert not list(tmp_path.glob("fuzz-http-reply-*"))  # no crash artifact


def test_the_fuzzer_reports_an_undocumented_error(tmp_path):
    # The same script, with the pool's body callback made to fail on some
    # bodies: a bug of the kind the fuzzer exists to find.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from providers import http_pool\n"
        "original = http_pool._Connection.on_body\n"
        "def on_body(self, body):\n"
        "    if len(body) == 3:\n"
        "        raise KeyError('planted bug')\n"
        "    original(self, body)\n"
        "http_pool._Connection.on_body = on_body\n"
        f"sys.argv = [{str(SCRIPT)!r}] + sys.argv[1:]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    result = subprocess.run([sys.executable, str(planted), "--engine", "random", "--seconds", "20"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "undocumented error KeyError: 'planted bug'" in result.stderr
