"""Every bad input a user can give is one clear line and a non-zero exit:
malformed configs (a schema checks every key at load), bad options, files that
are folders, not UTF-8, hold NUL bytes or wrong types, unwritable outputs,
damaged caches. Each case runs the real CLI (`engine.cli.main`, a subprocess
where the process matters) and checks: exit code, exactly one
`tulving: error:` line naming the culprit, no traceback, no raw control
character on the terminal."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.benchmark.evaluation.results import RESULTS_VERSION
from engine.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_clear_line(code: int, err: str, *needles: str, exit_code: int = 2) -> None:
    assert code == exit_code, (code, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("tulving: error:")]
    assert len(lines) == 1, err
    assert "\x1b" not in err and "\r" not in err, repr(err)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# -- the config: one line naming the key --------------------------------------------------------

EP = '[endpoints.e]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
MODEL = '[models.m]\nendpoint = "e"\nmodel = "x"\n'

CONFIGS = [
    # (TOML text, what the error line must name)
    ("endpoints = [[1]]\n", "endpoints must be a table"),
    ("endpoints = 5\n", "endpoints must be a table"),
    ("models = 5\n", "models must be a table"),
    ('models = "m"\n', "models must be a table"),
    ("[other]\nx = 1\n", "unknown top-level section"),
    ("endpoints.e = 3\n", "[endpoints.e] must be a table"),
    ("models.m = 3\n", "[models.m] must be a table"),
    ('[endpoints.e]\nbase_url = "http://h/v1"\n', "needs a kind"),
    ('[endpoints.e]\nkind = "nope"\n', "unknown kind"),
    ('[endpoints.e]\nkind = 5\n', "unknown kind"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = 5\n', "base_url must be a string"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "gpu-a:8000/v1"\n', "base_url must start with http"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "ftp://h/v1"\n', "base_url must start with http"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "http://"\n', "has no host"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "http:///v1"\n', "has no host"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "http://h:99999/v1"\n', "not a valid URL"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "http://h/v1#frag"\n', "fragment"),
    ('[endpoints.e]\nkind = "openai"\nbase_url = "http://h/v 1"\n', "spaces"),
    ('[endpoints.e]\nkind = "openai"\nkey_env = 123\n', "key_env must name an environment variable"),
    ('[endpoints.e]\nkind = "openai"\nkey_env = "MY KEY"\n', "key_env"),
    ('[endpoints.e]\nkind = "openai"\nkey_env = ""\n', "key_env"),
    ('[endpoints.e]\nkind = "openai"\nrpm = nan\n', "rpm must be a finite number"),
    ('[endpoints.e]\nkind = "openai"\nrpm = inf\n', "rpm must be a finite number"),
    ('[endpoints.e]\nkind = "openai"\nrpm = -5\n', "rpm"),
    ('[endpoints.e]\nkind = "openai"\nrpm = 0\n', "rpm"),
    ('[endpoints.e]\nkind = "openai"\nrpm = "fast"\n', "rpm"),
    ('[endpoints.e]\nkind = "openai"\nrpm = true\n', "rpm"),
    ('[endpoints.e]\nkind = "openai"\ninput_tpm = -1\n', "input_tpm"),
    ('[endpoints.e]\nkind = "openai"\noutput_tpm = nan\n', "output_tpm"),
    ('[endpoints.e]\nkind = "openai"\ntimeout = nan\n', "timeout must be a finite number"),
    ('[endpoints.e]\nkind = "openai"\ntimeout = 0\n', "timeout"),
    ('[endpoints.e]\nkind = "openai"\ntimeout = "10s"\n', "timeout"),
    ('[endpoints.e]\nkind = "openai"\ntotal_timeout = -3\n', "total_timeout"),
    ('[endpoints.e]\nkind = "openai"\nmax_concurrency = 2.5\n', "max_concurrency must be a whole number"),
    ('[endpoints.e]\nkind = "openai"\nmax_concurrency = 0\n', "max_concurrency"),
    ('[endpoints.e]\nkind = "openai"\nmax_concurrency = 10000000\n', "max_concurrency must be at most"),
    ('[endpoints.e]\nkind = "openai"\nmax_attempts = 0\n', "max_attempts"),
    ('[endpoints.e]\nkind = "openai"\nmax_attempts = "6"\n', "max_attempts"),
    ('[endpoints.e]\nkind = "openai"\nmax_retry_after = -1\n', "max_retry_after"),
    ('[endpoints.e]\nkind = "openai"\nmax_retry_after = nan\n', "max_retry_after"),
    ('[endpoints.e]\nkind = "openai"\nspeed = 3\n', "unknown key(s) ['speed']"),
    ('[endpoints.e]\nkind = "openai"\noptions = 5\n', "options must be a table"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = "x" }\n', "options.headers must be a table"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = { Host = "evil" } }\n', "must not set Host"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = { "Content-Length" = "1" } }\n', "Content-Length"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = { "transfer-encoding" = "x" } }\n', "transfer-encoding"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = { "X-A" = 5 } }\n', "options.headers.X-A must be"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = { "X-A" = "a\\r\\nInjected: 1" } }\n', "one-line"),
    ('[endpoints.e]\nkind = "openai"\noptions = { headers = { "bad name" = "v" } }\n', "invalid header name"),
    ('[endpoints.e]\nkind = "openai"\noptions = { drop_params = "seed" }\n', "drop_params must be a list"),
    ('[endpoints.e]\nkind = "openai"\noptions = { drop_params = [1] }\n', "drop_params"),
    ('[endpoints.e]\nkind = "openai"\noptions = { trust_env = "yes" }\n', "trust_env must be true or false"),
    ('[endpoints.e]\nkind = "openai"\noptions = { http_client = "curl" }\n', "http_client must be one of"),
    ('[endpoints.e]\nkind = "anthropic"\noptions = { anthropic_version = 2023 }\n', "anthropic_version"),
    ('[endpoints.e]\nkind = "openai"\noptions = { read_timeout = 0 }\n',
     "options.read_timeout must be a positive number of seconds"),
    ('[endpoints.e]\nkind = "openai"\noptions = { connect_timeout = "5s" }\n', "options.connect_timeout"),
    ('[endpoints.e]\nkind = "openai"\noptions = { first_byte_timeout = inf }\n', "options.first_byte_timeout"),
    ('[endpoints.e]\nkind = "openai"\noptions = { keepalive_timeout = true }\n', "options.keepalive_timeout"),
    (EP + '[models.m]\nmodel = "x"\n', "needs endpoint or endpoints"),
    (EP + '[models.m]\nendpoints = [[1]]\nmodel = "x"\n', "endpoints must be endpoint names"),
    (EP + '[models.m]\nendpoints = 5\nmodel = "x"\n', "endpoints must be a list"),
    (EP + '[models.m]\nendpoint = "nope"\nmodel = "x"\n', "unknown endpoint 'nope'"),
    (EP + '[models.m]\nendpoint = "e"\n', "needs model"),
    (EP + '[models.m]\nendpoint = "e"\nmodel = 5\n', "model must be a non-empty string"),
    (EP + '[models.m]\nendpoint = "e"\nmodel = ""\n', "model must be a non-empty string"),
    (EP + MODEL + 'price_in = "abc"\n', "price_in must be a finite number"),
    (EP + MODEL + 'price_out = nan\n', "price_out"),
    (EP + MODEL + 'price_in = -1\n', "price_in"),
    (EP + MODEL + 'context_tokens = "big"\n', "context_tokens must be a whole number"),
    (EP + MODEL + 'context_tokens = 0\n', "context_tokens"),
    (EP + MODEL + 'reasoning = "yes"\n', "reasoning must be true or false"),
    (EP + MODEL + 'params = 5\n', "params must be a table"),
    (EP + MODEL + 'params = { temperature = "hot" }\n', "params.temperature"),
    (EP + MODEL + 'params = { temperature = nan }\n', "params.temperature must be finite"),
    (EP + MODEL + 'params = { max_tokens = 0 }\n', "params.max_tokens"),
    (EP + MODEL + 'params = { max_tokens = 1.5 }\n', "params.max_tokens"),
    (EP + MODEL + 'colour = "red"\n', "unknown key(s) ['colour']"),
    ("[endpoints.e\n", "is not valid TOML"),
    ('x = "unterminated\n', "is not valid TOML"),
]


@pytest.mark.parametrize("text,needle", CONFIGS, ids=[f"config{i}" for i in range(len(CONFIGS))])
def test_a_malformed_config_is_one_line_naming_the_key(text, needle, tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(text)
    code, out, err = run_cli(["--config", str(path), "config", "check"], capsys)
    assert_one_clear_line(code, err, needle)
    assert out == ""


@pytest.mark.parametrize("case", ["folder", "missing", "not-utf8", "binary", "empty-name"])
def test_a_config_path_that_is_not_a_readable_toml_file(case, tmp_path, capsys):
    path = tmp_path / "c.toml"
    needle = str(path)
    if case == "folder":
        path.mkdir()
        needle = "is a folder"
    elif case == "not-utf8":
        path.write_bytes(b'[endpoints.e]\nkind = "openai"\n# caf\xe9\n')
        needle = "not UTF-8"
    elif case == "binary":
        path.write_bytes(bytes(range(256)) * 4)
        needle = "not UTF-8"
    elif case == "empty-name":
        path = tmp_path
        needle = "is a folder"
    elif case == "missing":
        needle = "not found"
    code, _, err = run_cli(["--config", str(path), "models"], capsys)
    assert_one_clear_line(code, err, needle)


# -- options ----------------------------------------------------------------------------------

OPTIONS = [
    (["--max-cost", "nan", "models"], "--max-cost"),
    (["--max-cost", "inf", "models"], "--max-cost"),
    (["--max-cost", "-1", "models"], "--max-cost"),
    (["--max-cost", "abc", "models"], "--max-cost"),
    (["run", "--sample", "0"], "--sample"),
    (["run", "--sample", "x"], "--sample"),
    (["run", "--models", ","], "--models"),
    (["run", "--modes", "telepathy", "--dry-run"], "telepathy"),
    (["run", "--models", "no-such-model", "--dry-run"], "no-such-model"),
    (["run", "--book", "no-such-book", "--dry-run"], "no-such-book"),
    (["generate", "--events", "0", "--events-only", "--out", "x"], "--events"),
    (["generate", "--events", "-3", "--events-only", "--out", "x"], "--events"),
    (["generate", "--events", "1000000000", "--events-only", "--out", "x"], "at most 10,000 events"),
    (["generate", "--events", "5", "--universe", "no-such-universe", "--events-only", "--out", "x"],
     "no-such-universe"),
    (["generate", "--events", "5"], "--out"),
    (["generate", "--events", "5", "--out", "x"], "--model"),
    (["bench-latency", "--model", "builtin:reader", "-n", "0"], "-n"),
    (["models", "--bogus"], "unrecognized arguments"),
    (["report"], "run_dir"),
    (["cache", "frobnicate"], "frobnicate"),
]


@pytest.mark.parametrize("argv,needle", OPTIONS, ids=[" ".join(a)[:40] for a, _ in OPTIONS])
def test_a_bad_option_is_one_line_and_exit_2(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["--cache", str(tmp_path / "c.sqlite"), *argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (code, err)
    assert "Traceback" not in err
    assert needle in err, err
    assert err.strip().splitlines()[-1].startswith(("tulving: error:", "tulving run: error:", "tulving generate",
                                                    "tulving bench-latency", "tulving models", "tulving report",
                                                    "tulving cache", "usage:")), err


def test_no_command_prints_the_usage_and_exits_non_zero(capsys):
    code = main([])
    _, err = capsys.readouterr()
    assert code == 2 and "usage: tulving" in err


# -- files the CLI reads ----------------------------------------------------------------------

def _book(tmp_path: Path, short_book) -> Path:
    from engine.benchmark.generation.bookdir import write_book_dir

    folder = tmp_path / "book"
    write_book_dir(folder, text=short_book.text, chapters=short_book.chapters, events=short_book.events,
                   meta_events=short_book.meta_events, metadata={"name": "b"})
    return folder


BOOK_DAMAGE = {
    "book.txt not UTF-8": (lambda f: (f / "book.txt").write_bytes(b"Chapter 1\n\ncaf\xe9"), "book.txt: not UTF-8"),
    "book.txt with NUL bytes": (lambda f: (f / "book.txt").write_text((f / "book.txt").read_text() + "\0\0"),
                                "NUL bytes"),
    "book.txt a folder": (lambda f: ((f / "book.txt").unlink(), (f / "book.txt").mkdir()), "book.txt: is a folder"),
    "chapters.json a folder": (lambda f: ((f / "chapters.json").unlink(), (f / "chapters.json").mkdir()),
                               "chapters.json: is a folder"),
    "chapters.json not JSON": (lambda f: (f / "chapters.json").write_text("[{"), "chapters.json: not valid JSON"),
    "events.json missing": (lambda f: (f / "events.json").unlink(), "missing events.json"),
    "events.json not UTF-8": (lambda f: (f / "events.json").write_bytes(b"[\xff]"), "events.json: not UTF-8"),
}


@pytest.mark.parametrize("damage", sorted(BOOK_DAMAGE))
def test_a_damaged_book_folder_is_one_line_naming_the_file(damage, tmp_path, capsys, short_book):
    folder = _book(tmp_path, short_book)
    spoil, needle = BOOK_DAMAGE[damage]
    spoil(folder)
    code, _, err = run_cli(["book", "stats", str(folder)], capsys)
    assert_one_clear_line(code, err, needle)


def _record(**changes) -> dict:
    base = {"q_idx": 0, "question": "q?", "get": "all", "bin": "0", "model": "m", "mode": "in-context",
            "answer": "a", "correct_answer": [], "f1": 1.0, "judge": "j", "results_version": RESULTS_VERSION}
    base.update(changes)
    return base


RESULTS = {
    "a line that is a list": ("[1, 2]\n", "a JSON list, not an object"),
    "a line that is a number": ("5\n", "a JSON int, not an object"),
    "not JSON": ("{nope\n", "not JSON"),
    "q_idx a string": (json.dumps(_record(q_idx="0")) + "\n", "q_idx is str"),
    "f1 a string": (json.dumps(_record(f1="high")) + "\n", "f1 is str"),
    "judge_failed a string": (json.dumps(_record(judge_failed="no")) + "\n", "judge_failed is str"),
    "answer a number": (json.dumps(_record(answer=5)) + "\n", "answer is int"),
    "correct_answer a string": (json.dumps(_record(correct_answer="x")) + "\n", "correct_answer is str"),
    "get unknown": (json.dumps(_record(get="some")) + "\n", "get is 'some'"),
    "no question": (json.dumps({"q_idx": 1}) + "\n", "no question"),
    "matching_scores of strings": (json.dumps(_record(matching_scores=["a"])) + "\n", "matching_scores"),
    "tau a list": (json.dumps(_record(tau=[1])) + "\n", "tau is list"),
}


@pytest.mark.parametrize("case", sorted(RESULTS))
def test_report_on_a_malformed_results_file_names_the_line(case, tmp_path, capsys):
    text, needle = RESULTS[case]
    (tmp_path / "results.jsonl").write_text(json.dumps(_record(q_idx=7)) + "\n" + text)
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert_one_clear_line(code, err, "results.jsonl:2", needle)


@pytest.mark.parametrize("run_json,needle", [("{nope", "not a readable run record"),
                                             ("[1]", "not a run record"),
                                             ('{"jobs": 5}', "not a run record"),
                                             ('{"jobs": [{"model": 1}]}', "not a run record"),
                                             (b"\xff\xfe", "not a readable run record")])
def test_report_on_a_malformed_run_json(run_json, needle, tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text(json.dumps(_record()) + "\n")
    path = tmp_path / "run.json"
    path.write_bytes(run_json if isinstance(run_json, bytes) else run_json.encode())
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert_one_clear_line(code, err, "run.json", needle)


def test_report_on_a_results_path_that_is_a_folder(tmp_path, capsys):
    (tmp_path / "results.jsonl").mkdir()
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert_one_clear_line(code, err, "is a folder")


# -- outputs the CLI writes: checked before the first call -------------------------------------

def test_out_that_is_an_existing_file_is_refused_before_any_call(tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("x")
    code, _, err = run_cli(["--cache", str(tmp_path / "c.sqlite"), "run", "--sample", "2", "--out", str(out)],
                           capsys)
    assert_one_clear_line(code, err, "exists and is not a folder", exit_code=5)
    assert not (tmp_path / "c.sqlite").exists()  # no engine was opened, no call made


@pytest.mark.parametrize("where", ["read-only folder", "/sys"])
def test_out_that_cannot_be_written_is_refused_before_any_call(where, tmp_path, capsys):
    # A read-only folder stops everyone but root; /sys refuses even root.
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    out = locked / "run" if where == "read-only folder" and os.geteuid() != 0 else Path("/sys/tulving-run")
    try:
        code, _, err = run_cli(["--cache", str(tmp_path / "c.sqlite"), "run", "--sample", "2", "--out", str(out)],
                               capsys)
    finally:
        locked.chmod(0o700)
    assert_one_clear_line(code, err, "cannot write to the output folder", exit_code=5)
    assert not (tmp_path / "c.sqlite").exists()


def test_generate_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "f"
    out.write_text("x")
    code, _, err = run_cli(["generate", "--events", "3", "--events-only", "--out", str(out)], capsys)
    assert_one_clear_line(code, err, "exists and is not a folder", exit_code=5)


# -- the process --------------------------------------------------------------------------------

def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TULVING_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=kwargs.pop("cwd", None), env=env, **kwargs)


def test_global_options_are_accepted_after_the_command(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(EP + MODEL)
    done = _cli("config", "check", "--config", str(config), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "[models.m]" in done.stdout


def test_piping_into_head_exits_quietly(tmp_path):
    done = subprocess.run(f"{sys.executable} -m engine.cli models | head -1", shell=True, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stdout.startswith("alias")


def test_names_with_terminal_controls_or_pipes_cannot_break_the_tables(tmp_path, capsys):
    name = "evil|model\x1b[2J\x1b]0;title\x07"
    (tmp_path / "results.jsonl").write_text(json.dumps(_record(model=name)) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    out, _ = capsys.readouterr()
    assert "\x1b" not in out and "\x07" not in out and "evil|model\\x1b[2J" in out
    report = (tmp_path / "report.md").read_text()
    assert "\x1b" not in report and "evil\\|model" in report
    rows = [line for line in report.splitlines() if line.startswith("| 1 | evil")]
    assert rows
    header = next(line for line in report.splitlines() if line.startswith("| #"))
    assert rows[0].replace("\\|", "").count("|") == header.count("|")
