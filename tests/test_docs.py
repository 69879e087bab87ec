"""The README and the documentation site point at files that exist.

Every `engine/...`, `providers/...`, `cache/...`, `benchmarks/...` and
`tests/...` path written in README.md or docs/ must exist in the repository
(files move: the text must move with them), every relative link of the README
must reach a file, and the README stays short (the rest lives in docs/).
The site's own links and anchors are checked by `mkdocs build --strict` in
.ci/run.
"""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOC_PAGES = sorted((REPO / "docs").rglob("*.md"))

# A path starts at one of these folders (not in the middle of another path or
# word) and runs on over path characters; a trailing dot or comma is prose.
PATH = re.compile(r"(?<![\w./-])((?:engine|providers|cache|benchmarks|tests)/[\w./-]*)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_MAX_LINES = 250


def mentioned_paths(text: str) -> set[str]:
    return {match.rstrip(".,") for match in PATH.findall(text)}


def test_the_documents_exist_and_the_path_pattern_finds_paths():
    assert README.is_file() and DOC_PAGES
    assert mentioned_paths("see `engine/cli/main.py`, and tests/test_layers.py.") == {
        "engine/cli/main.py", "tests/test_layers.py"}
    assert mentioned_paths("runs/cache.sqlite, my-engine/x, ../shared/spec/protocol.md") == set()


def test_every_path_mentioned_in_the_readme_and_the_docs_exists():
    missing = []
    for page in [README, *DOC_PAGES]:
        for path in sorted(mentioned_paths(page.read_text(encoding="utf-8"))):
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_readme_links_reach_files():
    links = LINK.findall(README.read_text(encoding="utf-8"))
    assert links, "the README links into docs/"
    broken = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert not broken, broken


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move the detail to docs/"
