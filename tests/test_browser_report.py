"""The HTML report opened in a real headless browser (Debian's chromium,
installed by .ci/run), driven over the Chrome DevTools Protocol: the rendered
DOM has the tables with their row counts, every image decoded, the drill-down
filters hide rows (by a scripted change, and from the URL fragment), nothing a
model wrote ran as script; a screenshot is saved under benchmarks/artifacts/."""
from __future__ import annotations

import asyncio
import base64
import csv
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import aiohttp
import pytest

from tests.report_runs import (
    EVIL_JUDGE_FAILURES,
    EVIL_MODEL,
    SAMPLE,
    SAMPLED_MODEL,
)

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "benchmarks" / "artifacts"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless chromium with its DevTools endpoint on a free port, no network use."""

    def __init__(self, executable: str):
        self.executable = executable
        self.profile = tempfile.mkdtemp(prefix="tulving-chromium-")
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--window-size=1400,1000", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                self.port = int(match.group(1))
                # Keep reading its stderr, so that a chatty browser never blocks on a full pipe.
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()
                return
        raise RuntimeError(f"chromium exited without a DevTools endpoint (code {self.proc.wait()})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """A minimal CDP client for one page target: commands in, results out."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.ids = itertools.count(1)

    async def send(self, method: str, **params):
        n = next(self.ids)
        await self.ws.send_json({"id": n, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 60)
            if msg.get("id") == n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def eval(self, expression: str):
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"script error: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_loaded(self) -> None:
        for _ in range(200):
            if await self.eval("document.readyState === 'complete' && !!document.getElementById('shown')"):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError("page did not finish loading")


@pytest.fixture(scope="module")
def report(three_run_report):
    """The report over a good, a hostile and a sampled run (conftest.py; the same one
    tests/test_report_html.py reads)."""
    return three_run_report


DOM_FACTS = """(() => {
  const tables = {};
  for (const t of document.querySelectorAll('table.data')) tables[t.id] = t.tBodies[0].rows.length;
  const imgs = [...document.images];
  return {tables, images: imgs.length,
          decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
          shown: Number(document.getElementById('shown').textContent),
          visible: [...document.querySelectorAll('#drill tbody tr')].filter(r => !r.hidden).length,
          pwned: typeof window.PWNED !== 'undefined',
          scripts: document.scripts.length};
})()"""


async def test_report_renders_and_filters_in_a_real_browser(report):
    executable = find_browser()
    if executable is None:
        pytest.skip("no headless browser: install Debian's chromium (apt-get install chromium; .ci/run does)")
    browser = Browser(executable)
    url = (report / "index.html").resolve().as_uri()
    try:
        browser.start(url)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{browser.port}/json/list") as resp:
                targets = await resp.json()
            page_target = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(page_target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.wait_loaded()
                facts = await page.eval(DOM_FACTS)

                # The tables, with the rows the CSV files hold.
                for key in ("leaderboard", "f1_by_bin_all", "f1_by_cue_bin", "chronological"):
                    with open(report / "tables" / f"{key}.csv", newline="") as f:
                        assert facts["tables"][f"t-{key}"] == len(list(csv.DictReader(f))), key
                assert facts["tables"]["t-f1_by_bin_all"] == 3
                assert facts["tables"]["drill"] == 2 * 456 + SAMPLE
                # Every figure decoded; the model's <script> never ran.
                assert facts["images"] == 7 and facts["decoded"] == 7
                assert not facts["pwned"] and facts["scripts"] == 1
                assert facts["shown"] == facts["visible"] == 2 * 456 + SAMPLE

                # A scripted filter: the hostile model, then only its failures.
                await page.eval(f"""(() => {{ const s = document.getElementById('f-model');
                    s.value = {json.dumps(EVIL_MODEL)}; s.dispatchEvent(new Event('change')); }})()""")
                facts = await page.eval(DOM_FACTS)
                assert facts["shown"] == facts["visible"] == 456
                await page.eval("""(() => { const c = document.getElementById('f-failures');
                    c.checked = true; c.dispatchEvent(new Event('change')); })()""")
                facts = await page.eval(DOM_FACTS)
                assert facts["shown"] == facts["visible"] == EVIL_JUDGE_FAILURES + 1
                assert "failures=1" in await page.eval("location.hash")

                # The filter state from the URL fragment: bin 2 of the sampled run.
                await page.send("Page.navigate", url=url + "#model=" + SAMPLED_MODEL + "&bin=2")
                await asyncio.sleep(0.5)
                await page.wait_loaded()
                facts = await page.eval(DOM_FACTS)
                expected = sum(1 for line in (report.parent / "sampled" / "results.jsonl").read_text().splitlines()
                               if json.loads(line)["bin"] == "2")
                assert 0 < facts["shown"] == facts["visible"] == expected

                await page.send("Page.navigate", url=url)
                await asyncio.sleep(0.5)
                await page.wait_loaded()
                shot = await page.send("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / "report_screenshot.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"screenshot: {path}")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        browser.stop()


# Every cell of one word (a name, a figure: "builtin:reader", "0.718") or
# marked as a name or figure (class label / num), in the first 40 rows of each
# table, on one line: its height is one line's, whatever the page's width.
WRAPPED = """(() => {
  const out = [];
  const cells = [...document.querySelectorAll('table.data')].flatMap(
    t => [...t.tBodies[0].rows].slice(0, 40).flatMap(r => [...r.cells]));
  for (const td of cells) {
    const text = td.textContent.trim();
    if (!text || !(/^\\S+$/.test(text) || td.classList.contains('label') || td.classList.contains('num'))) continue;
    const style = getComputedStyle(td);
    const line = parseFloat(style.fontSize) * 1.6;
    const range = document.createRange(); range.selectNodeContents(td);
    if (range.getBoundingClientRect().height > line) out.push(td.textContent);
    if (out.length > 5) break;
  }
  return {wrapped: out, width: window.innerWidth, overflow: document.documentElement.scrollWidth - window.innerWidth,
          board: [...document.querySelectorAll('#t-leaderboard tbody tr')].map(r => r.cells[4].textContent)};
})()"""


async def test_the_report_reads_at_a_glance_at_1400_px_and_at_a_phones_width(report):
    """Names and figures never wrap (the drill-down showed "builtin:r / eader"
    and "1. / 00 / 0"), wide tables scroll inside their box rather than the
    page, the leaderboard gives its intervals; a screenshot of the top of the
    page at each width is saved under benchmarks/artifacts/ to look at."""
    executable = find_browser()
    if executable is None:
        pytest.skip("no headless browser: install Debian's chromium (apt-get install chromium; .ci/run does)")
    browser = Browser(executable)
    try:
        browser.start((report / "index.html").resolve().as_uri())
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{browser.port}/json/list") as resp:
                page_target = next(t for t in await resp.json() if t["type"] == "page")
            async with session.ws_connect(page_target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.wait_loaded()
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                for width, mobile in ((1400, False), (390, True)):
                    await page.send("Emulation.setDeviceMetricsOverride", width=width, height=1000,
                                    deviceScaleFactor=1, mobile=mobile)
                    await asyncio.sleep(0.3)
                    facts = await page.eval(WRAPPED)
                    assert facts["wrapped"] == [], (width, facts["wrapped"])
                    # Nothing wider than the screen outside a scrolling box (a phone would zoom the page out).
                    assert facts["width"] == width and facts["overflow"] <= 1, (width, facts)
                    assert all(re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", c) for c in facts["board"][:2])
                    shot = await page.send("Page.captureScreenshot", format="png")
                    path = ARTIFACTS / f"report_{width}px.png"
                    path.write_bytes(base64.b64decode(shot["data"]))
                    print(f"screenshot: {path}")
    finally:
        browser.stop()
