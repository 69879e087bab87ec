"""Download the release zip: resumable, size- and SHA-256-checked.

    fetch(url, folder) -> Path of the verified zip (folder/release.zip)

A zip already there whose hash is the expected one is used as it is.

The folder is made when the first bytes arrive: a fetch that cannot reach
the server leaves nothing behind, and its error names the way by hand
(download the zip elsewhere, `tulving data import FILE`).

The bytes go to `folder/release.zip.part`; a rerun after an interruption asks
the server for the rest (HTTP Range) and appends, or starts over when the
server ignores the range. The download must reach the size the server
announced (else: truncated, the part is kept to resume); then its SHA-256 must
be the expected one: EXPECTED_SHA256 once known; until then the hash recorded
by the first verified download (`folder/release.sha256.json`, written after
the zip passed its CRC check), so later fetches must match it. A wrong hash
removes the part (it cannot be resumed into a good file).
"""
from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from http.client import HTTPResponse
from pathlib import Path

from engine.benchmark.release.layout import DOI_URL, DOWNLOAD_URL, ReleaseError

# The release zip's SHA-256 and size: not known yet (figshare could not be
# reached where this was written). Set them once a download has been verified.
EXPECTED_SHA256: str | None = None
EXPECTED_SIZE: int | None = None
PART = "release.zip.part"
ZIP = "release.zip"
RECORDED = "release.sha256.json"
_CHUNK = 1 << 16
_TIMEOUT = 60.0

Progress = Callable[[int, int | None], None]
# The next step when this machine cannot download: another one can.
BY_HAND = (f": download the release by hand from {DOI_URL} (\"Download all\", one zip) and import it with "
           f"`tulving data import FILE`")


def _open(url: str, offset: int) -> tuple[HTTPResponse | None, int, int | None]:
    """(response, offset the body starts at, total size or None)."""
    request = urllib.request.Request(url, headers={"User-Agent": "tulving-data-fetch"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=_TIMEOUT)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the part already holds every byte
            total = (exc.headers.get("Content-Range") or "").rpartition("/")[2]
            return None, offset, int(total) if total.isdigit() else offset
        raise ReleaseError(f"{url}: cannot download (HTTP {exc.code} {exc.reason}){BY_HAND}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ReleaseError(f"{url}: cannot download ({reason}){BY_HAND}") from None
    if response.status == 206:
        total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
        start = int(response.headers.get("Content-Range", "bytes 0-").split()[1].split("-")[0])
        return response, start, int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return response, 0, int(length) if length and length.isdigit() else None


def _download(url: str, part: Path, progress: Progress) -> int | None:
    """Bring part up to the whole file; the announced total size (None: unknown)."""
    offset = part.stat().st_size if part.exists() else 0
    response, start, total = _open(url, offset)
    if response is None:
        return total
    part.parent.mkdir(parents=True, exist_ok=True)  # only now: a fetch that cannot start leaves no folder behind
    with response, open(part, "r+b" if start and part.exists() else "wb") as out:
        out.seek(start)
        out.truncate()
        done, last = start, 0.0
        while True:
            try:
                chunk = response.read(_CHUNK)
            except (OSError, TimeoutError) as exc:
                raise ReleaseError(f"{url}: download cut at {done:,} bytes ({exc}): rerun to resume") from None
            if not chunk:
                break
            out.write(chunk)
            done += len(chunk)
            if time.monotonic() - last > 0.5:
                progress(done, total)
                last = time.monotonic()
        progress(done, total)
    return total


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def expected(folder: Path) -> tuple[str | None, int | None]:
    """The SHA-256 and size the download must have: the constants, else the recorded ones."""
    if EXPECTED_SHA256 is not None:
        return EXPECTED_SHA256, EXPECTED_SIZE
    path = folder / RECORDED
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text())
        return str(data["sha256"]), int(data["size"])
    except (ValueError, KeyError, TypeError):
        raise ReleaseError(f"{path}: damaged record of the release's checksum (remove it to record a new one)") from None


def _verify(part: Path, total: int | None, folder: Path, url: str) -> None:
    size = part.stat().st_size
    if total is not None and size != total:
        raise ReleaseError(f"truncated download: {size:,} of {total:,} bytes in {part} (rerun to resume)")
    want_sha, want_size = expected(folder)
    got = sha256_of(part)
    if want_sha is not None and (got != want_sha or (want_size is not None and size != want_size)):
        part.unlink()
        raise ReleaseError(f"checksum mismatch: {url} gave SHA-256 {got} ({size:,} bytes), expected {want_sha}"
                           f"{f' ({want_size:,} bytes)' if want_size else ''}: the download was removed")
    try:
        with zipfile.ZipFile(part) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile as exc:
        part.unlink()
        raise ReleaseError(f"{url}: not a zip ({exc}): the download was removed") from None
    if bad is not None:
        part.unlink()
        raise ReleaseError(f"{url}: corrupt zip (member {bad!r} fails its CRC): the download was removed")
    if want_sha is None:
        (folder / RECORDED).write_text(json.dumps({"sha256": got, "size": size, "url": url}, indent=1) + "\n")


def fetch(url: str | None, folder: Path, progress: Progress = lambda done, total: None) -> Path:
    """Download (or finish downloading) the release into folder; the verified zip's path."""
    url = url or DOWNLOAD_URL
    part, final = folder / PART, folder / ZIP
    want_sha, _ = expected(folder)
    if final.is_file() and not part.exists() and want_sha is not None and sha256_of(final) == want_sha:
        return final  # fetched and verified before: nothing to download
    total = _download(url, part, progress)
    _verify(part, total, folder, url)
    part.replace(final)
    return final
