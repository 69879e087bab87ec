"""docs/architecture.md's table "One module per job" against the code: every
module of every folder it lists is named in that folder's row, and every
module the table names exists. A module added, renamed or deleted without
the page following fails here."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
# The package's folders of modules (the data folder holds no code).
PACKAGES = ("engine", "providers", "cache")


def table_rows() -> dict[str, set[str]]:
    """{folder: the names written as `name` in its row}, from the module table."""
    text = PAGE.read_text()
    section = text.split("## One module per job", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        folder = cells[0].strip("`").rstrip("/")
        rows[folder] = set(re.findall(r"`([^`]+)`", cells[1]))
    return rows


def folders_of_modules() -> dict[str, set[str]]:
    """{folder: its modules (dunder files aside)} for every folder of the package holding code."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name.startswith("__") or "data" in path.relative_to(REPO).parts:
                continue
            found.setdefault(path.parent.relative_to(REPO).as_posix(), set()).add(path.stem)
    return found


def test_every_folder_of_code_has_a_row_and_every_row_a_folder():
    rows, folders = table_rows(), folders_of_modules()
    assert set(rows) == set(folders), (sorted(set(folders) - set(rows)), sorted(set(rows) - set(folders)))


def test_every_module_is_named_in_its_folders_row_and_nothing_else_is():
    rows, folders = table_rows(), folders_of_modules()
    problems = []
    for folder, modules in sorted(folders.items()):
        named = rows.get(folder, set())
        if missing := modules - named:
            problems.append(f"{folder}: not in the table: {sorted(missing)}")
        if gone := named - modules:
            problems.append(f"{folder}: named in the table, no such module: {sorted(gone)}")
    assert not problems, "\n".join(problems)


def test_the_table_is_read_at_all():
    """The parser finds the rows (a reformatted table must not pass by finding nothing)."""
    rows = table_rows()
    assert len(rows) >= 10 and "store" in rows["cache"] and "scheduler" in rows["engine"]
