"""`tulving leaderboard`: the static page of bundles, opened in headless
chromium (tests/test_browser_report.py's driver): one ranked table holding a
Tulving run's rows, an answers file's and the paper's imported runs'; a
tampered bundle's rows shown as NOT VERIFIED and unranked; every row linking
to its bundle's page (provenance and verify result); nothing a bundle holds
runs as script. A screenshot is saved under benchmarks/artifacts/."""
from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest

from engine.benchmark.evaluation.bundle import record_digest, sha256
from tests.report_runs import copied_run, tulving
from tests.test_browser_report import ARTIFACTS, Browser, Page, find_browser

EVIL = "<script>window.PWNED=1</script>"


@pytest.fixture(scope="module")
def site(tmp_path_factory, offline_short_run):
    from engine.benchmark.release.importer import import_release
    from tests.release_archive import build_release

    root = tmp_path_factory.mktemp("leaderboard")
    run = copied_run(offline_short_run, root)
    assert tulving(root, "bundle", str(run)).returncode == 0
    bundle = json.loads((run / "bundle.json").read_text())
    bundle["claimed"]["runs"][0]["simple_recall"] = 0.99  # a claim that does not follow
    bundle["claimed"]["runs"][0]["model"] = EVIL
    for line in bundle["records"]:
        line["model"] = EVIL
        line["sha256"] = record_digest(line)
    bundle["sha256"] = sha256({k: v for k, v in bundle.items() if k != "sha256"})
    (root / "forged.json").write_text(json.dumps(bundle))
    import_release(build_release(root / "release"), root / "data")
    published = sorted((root / "data" / "runs" / "published").glob("*/*/bundle.json"))
    result = tulving(root, "leaderboard", str(run / "bundle.json"), str(root / "forged.json"),
                     *map(str, published), "--out", "site")
    assert result.returncode == 0, result.stderr
    assert "leaderboard: site/index.html (5 bundles, 5 rows, 4 verified" in result.stdout
    assert "forged.json does not verify" in result.stderr
    return root / "site"


PAGE_FACTS = """(() => {
  const rows = [...document.querySelectorAll('table.board tbody tr')];
  return {rows: rows.length,
          cells: rows.map(r => [...r.cells].map(c => c.textContent.trim())),
          unverified: rows.filter(r => r.className === 'unverified').length,
          links: rows.map(r => r.querySelector('a').getAttribute('href')),
          pwned: typeof window.PWNED !== 'undefined', scripts: document.scripts.length};
})()"""


async def test_the_leaderboard_page_in_a_real_browser(site):
    executable = find_browser()
    if executable is None:
        pytest.skip("no headless browser: install Debian's chromium (apt-get install chromium; .ci/run does)")
    browser = Browser(executable)
    try:
        browser.start((site / "index.html").resolve().as_uri())
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{browser.port}/json/list") as resp:
                target = next(t for t in await resp.json() if t["type"] == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                for _ in range(100):
                    if await page.eval("document.readyState === 'complete' && !!document.querySelector('table.board')"):
                        break
                    await asyncio.sleep(0.1)
                facts = await page.eval(PAGE_FACTS)
                shot = await page.send("Page.captureScreenshot", format="png")
                await page.send("Page.navigate", url=(site / facts["links"][0]).resolve().as_uri())
                await asyncio.sleep(0.5)
                first = await page.eval("document.body.innerText")
    finally:
        browser.stop()
    ranks = [c[0] for c in facts["cells"]]
    models = [c[1] for c in facts["cells"]]
    assert facts["rows"] == 5 and facts["unverified"] == 1
    assert not facts["pwned"] and facts["scripts"] == 0
    forged = next(c for c in facts["cells"] if c[1] == EVIL)  # shown as text, unranked, marked
    assert forged[0] == "-" and forged[-1] == "NOT VERIFIED" and forged[3].startswith("0.990")
    # Ranked: the verified full rows by Simple Recall (builtin:reader 0.718, the paper's fixture rows).
    assert ranks[:3] == ["1", "2", "3"] and models[:3] == ["builtin:reader", "gpt-4o-mini-2024-07-18",
                                                           "claude-3-haiku-20240307"]
    assert any("published runs" in c[10] for c in facts["cells"])
    assert "VERIFIED" in first and "SHA-256" in first and "tulving verify" in first
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "leaderboard_screenshot.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
