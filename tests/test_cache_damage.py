"""A damaged cache file never gives a wrong answer or a traceback: a changed
byte inside an entry fails its checksum (a miss, asked again), a file SQLite
cannot read is one line naming it and what to do, and `tulving cache recover`
copies what is still readable. Real runs of the CLI over a real SQLite file."""
from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from engine.cli.main import main

RUN = ["run", "--models", "builtin:reader", "--sample", "6"]


def run(cache: Path, out: Path, capsys) -> tuple[int, str, list]:
    code = main(["--quiet", "--cache", str(cache), *RUN, "--out", str(out)])
    _, err = capsys.readouterr()
    answers = []
    if code == 0:
        answers = [(r["q_idx"], r["answer"], r["judge_reply"])
                   for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())]
    return code, err, answers


@pytest.fixture
def clean(tmp_path, capsys):
    cache = tmp_path / "c.sqlite"
    code, err, answers = run(cache, tmp_path / "clean", capsys)
    assert code == 0, err
    with sqlite3.connect(cache) as conn:  # fold the WAL into the file, as a closed cache is
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return cache, answers


def test_a_changed_byte_inside_a_cached_answer_is_a_miss_not_a_wrong_answer(clean, tmp_path, capsys):
    cache, answers = clean
    with sqlite3.connect(cache) as conn:
        key, response = conn.execute("SELECT key, response FROM entries WHERE json_extract(response, '$.text') "
                                     "!= '' LIMIT 1").fetchone()
    text = json.loads(response)["text"]
    data = bytearray(cache.read_bytes())
    at = data.find(json.dumps(text)[1:-1].encode()[:24])
    assert at > 0
    data[at] = ord("#") if data[at] != ord("#") else ord("%")  # one byte, inside the answer
    cache.write_bytes(bytes(data))
    code, err, again = run(cache, tmp_path / "again", capsys)
    assert code == 0, err
    assert again == answers  # asked again, not served damaged
    assert main(["--cache", str(cache), "cache", "check"]) == 0  # the rerun rewrote the entry
    capsys.readouterr()


def test_cache_check_names_a_damaged_entry(clean, capsys):
    cache, _ = clean
    with sqlite3.connect(cache) as conn:
        conn.execute("UPDATE entries SET response = replace(response, 'a', 'b') WHERE rowid = 1")
    assert main(["--cache", str(cache), "cache", "check"]) == 5
    out, _ = capsys.readouterr()
    assert "1 damaged entries" in out and "cache recover" in out


def test_an_answer_whose_bytes_are_not_utf8_is_a_miss_and_named_by_cache_check(clean, tmp_path, capsys):
    """A byte changed into one UTF-8 cannot hold (0xff): the run asks again and
    gives the same answers, and `cache check` lists the entry as damaged and
    goes on reading (it used to stop at the row with 0 entries counted)."""
    cache, answers = clean
    with sqlite3.connect(cache) as conn:
        total = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
        key = conn.execute("SELECT key FROM entries WHERE json_extract(response, '$.text') != '' "
                           "ORDER BY rowid LIMIT 1").fetchone()[0]
        conn.execute("UPDATE entries SET response = CAST(CAST(response AS BLOB) || X'ff' AS TEXT) WHERE key = ?",
                     (key,))
    assert main(["--cache", str(cache), "cache", "check"]) == 5
    out, _ = capsys.readouterr()
    assert f"cache {cache}: {total} entries, {total - 1} verified by checksum" in out
    assert "1 damaged entries" in out and key[:16] in out and "reading stopped" not in out
    code, err, again = run(cache, tmp_path / "again", capsys)
    assert code == 0, err
    assert again == answers  # asked again, not served damaged, not a failed lookup
    assert main(["--cache", str(cache), "cache", "check"]) == 0  # the rerun rewrote the entry
    capsys.readouterr()


DAMAGE = {
    "not SQLite": lambda data: b"this is a text file, not a cache\n" * 100,
    "truncated to half": lambda data: data[:len(data) // 2],
    "truncated to 100 bytes": lambda data: data[:100],
    "random bytes in the middle": lambda data: (data[:len(data) // 2] + random.Random(0).randbytes(8192)
                                                + data[len(data) // 2 + 8192:]),
    "random bytes in the header": lambda data: data[:20] + random.Random(1).randbytes(60) + data[80:],
    "zeroed second page": lambda data: data[:4096] + bytes(4096) + data[8192:],
    "zeroed last page": lambda data: data[:-4096] + bytes(4096),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_file_is_one_clear_line_or_right_answers(damage, clean, tmp_path, capsys):
    cache, answers = clean
    cache.write_bytes(DAMAGE[damage](cache.read_bytes()))
    code, err, again = run(cache, tmp_path / "again", capsys)
    assert "Traceback" not in err
    if code == 0:
        assert again == answers  # whatever SQLite could still read was right
    else:
        lines = [line for line in err.splitlines() if line.startswith("tulving: error:")]
        assert len(lines) == 1 and str(cache) in lines[0], err
        assert "cache recover" in lines[0] or "--cache elsewhere" in lines[0], lines[0]
        assert all(c.isprintable() for c in lines[0]), repr(lines[0])


def test_recover_copies_the_readable_entries_into_a_working_cache(clean, tmp_path, capsys):
    cache, answers = clean
    with sqlite3.connect(cache) as conn:
        total = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
        conn.execute("UPDATE entries SET response = replace(response, 'e', 'E') WHERE rowid = 2")
    target = tmp_path / "recovered.sqlite"
    assert main(["--cache", str(cache), "cache", "recover", "--out", str(target)]) == 0
    out, _ = capsys.readouterr()
    assert f"recovered {total - 1} entries" in out and "1 damaged" in out
    code, err, again = run(target, tmp_path / "again", capsys)
    assert code == 0 and again == answers, err


def test_a_cache_in_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    code, err, _ = run(Path("/sys/tulving/c.sqlite"), tmp_path / "out", capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("tulving: error:")]
    assert len(lines) == 1 and "/sys/tulving" in lines[0], err


def test_cache_explain_says_when_nothing_close_exists(clean, tmp_path, capsys):
    cache, _ = clean
    request = tmp_path / "r.json"
    request.write_text(json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}))
    assert main(["--cache", str(cache), "cache", "explain", str(request)]) == 0
    out, _ = capsys.readouterr()
    assert "nothing close" in out and "differs in model, kind, base_url" in out, out


def test_a_cache_path_that_is_a_folder_is_one_line(tmp_path, capsys):
    code, err, _ = run(tmp_path, tmp_path / "out", capsys)
    assert code == 2 and "is a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["stats"], ["export", "-"], ["prune", "--older-than", "0"], ["check"]])
def test_cache_commands_on_a_damaged_file_are_one_line(command, clean, capsys):
    cache, _ = clean
    data = cache.read_bytes()
    cache.write_bytes(data[:4096] + bytes(4096) + data[8192:])  # the second page zeroed
    code = main(["--cache", str(cache), "cache", *command])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code != 0  # the zeroed page is noticed
    if code != 0:
        lines = [line for line in err.splitlines() if line.startswith("tulving: error:")]
        assert (len(lines) == 1 and str(cache) in lines[0]) or "damaged" in out, (code, err, out)
