"""Fuzz the pool's reply parsing (providers/http_pool.py) for a bounded time or number of inputs.

    python benchmarks/fuzz_http_reply.py [--seconds 60 | --runs N] [--engine atheris|random] [--seed N]

Each input is a server's bytes, cut into up to three reads, answering one
POST, whole (`HttpPool.post`) or streamed (`post_stream`, the body drained);
then the server closes the connection. The pool may return a reply or raise
one of its documented errors (`MalformedReply` and its subclasses,
`ReplyCutShort`); anything else escaping the connection or the call, a reply
with an impossible status, or a call left hanging is a failure: the input is
printed (and saved) and the script exits 1.

Engines: `atheris` (Google's coverage-guided fuzzer for Python, libFuzzer
underneath; the default when it is installed) or `random`, a seeded mutation
fuzzer of this script's own over the same seeds (any machine, reproducible
with `--seed`). Both start from well-formed replies: Content-Length, chunked
with extensions and trailers, gzip and deflate, 1xx interim replies,
204/304, close-delimited bodies, Keep-Alive hints, two replies back to back.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    import atheris
except ImportError:  # the random engine needs nothing
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["providers.http_pool"]):
        from providers import http_pool
else:
    from providers import http_pool

MAX_BODY = 64 * 1024  # small limits: the limits' own paths get reached
MAX_HEADER = 4 * 1024
DOCUMENTED = (http_pool.MalformedReply, http_pool.ReplyCutShort)


class _Wire:
    """The connection's transport: what it writes goes nowhere; closing is noted."""

    def __init__(self) -> None:
        self.closing = False

    def writelines(self, parts: list[bytes]) -> None:
        pass

    def abort(self) -> None:
        self.closing = True

    close = abort

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class Failure(AssertionError):
    """The pool did something other than a reply or a documented error."""


def split_input(raw: bytes) -> tuple[bool, list[bytes]]:
    """An input's layout: a flags byte (bit 0: streamed), two 16-bit cut
    points, then the server's bytes."""
    if len(raw) < 5:
        return False, [raw]
    streaming = bool(raw[0] & 1)
    cut1, cut2 = struct.unpack(">HH", raw[1:5])
    data = raw[5:]
    cuts = sorted([min(cut1, len(data)), min(cut2, len(data))])
    pieces = [data[:cuts[0]], data[cuts[0]:cuts[1]], data[cuts[1]:]]
    return streaming, [p for p in pieces if p]


def make_input(data: bytes, *, streaming: bool = False, cuts: tuple[int, int] = (0, 0)) -> bytes:
    return bytes([int(streaming)]) + struct.pack(">HH", *cuts) + data


async def _exchange(streaming: bool, pieces: list[bytes]) -> None:
    loop = asyncio.get_running_loop()
    pool = http_pool.HttpPool(limit=1, max_header_size=MAX_HEADER, max_body_size=MAX_BODY)
    pool._loop = loop
    pool._active = 1  # this call holds the one slot
    conn = http_pool._Connection(loop, pool, ("http", "fuzz", 80))
    wire = _Wire()
    conn.connection_made(wire)  # type: ignore[arg-type]
    waiter = conn.send([b"POST / HTTP/1.1\r\n\r\n"], loop.time() + 3600, streaming)
    stream: http_pool.PooledStream | None = None
    error: BaseException | None = None
    try:
        for piece in pieces + [None]:  # None: the server closes the connection
            if wire.closing:
                break
            if piece is None:
                conn.connection_lost(None)
            else:
                conn.data_received(piece)
            if streaming and stream is None and waiter.done() and waiter.exception() is None:
                status, headers, _ = waiter.result()
                _check_head(status, headers)
                stream = http_pool.PooledStream(pool, conn, status, headers)
        if not wire.closing and not conn.closed:
            conn.connection_lost(None)
        if not waiter.done():
            raise Failure("the call was left hanging after the connection closed")
        if waiter.exception() is not None:
            error = waiter.exception()
        elif stream is not None:
            body = await asyncio.wait_for(stream.read(), 5)
            if not isinstance(body, bytes) or len(body) > MAX_BODY:
                raise Failure(f"streamed body of {len(body)} bytes, over the limit of {MAX_BODY}")
        elif not streaming:
            status, headers, body = waiter.result()
            _check_head(status, headers)
            if not isinstance(body, bytes) or len(body) > MAX_BODY:
                raise Failure(f"body of {len(body)} bytes, over the limit of {MAX_BODY}")
    except DOCUMENTED as exc:
        error = exc
    except Failure:
        raise
    except Exception as exc:
        raise Failure(f"undocumented error {type(exc).__name__}: {exc}") from exc
    finally:
        conn.disarm()
    if error is not None and not isinstance(error, DOCUMENTED):
        raise Failure(f"undocumented error {type(error).__name__}: {error}") from error


def _check_head(status: object, headers: object) -> None:
    if not isinstance(status, int) or not 200 <= status <= 999:
        raise Failure(f"reply with status {status!r}")
    if not isinstance(headers, dict) or not all(isinstance(k, str) and k == k.lower() and isinstance(v, str)
                                                for k, v in headers.items()):
        raise Failure(f"reply headers not a dict of lower-case strings: {headers!r}")


_loop: asyncio.AbstractEventLoop | None = None


def test_one_input(raw: bytes) -> None:
    """One input, in a loop of its own kept across inputs; raises on a failure."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        _loop.set_exception_handler(_unexpected)
    streaming, pieces = split_input(raw)
    _loop.run_until_complete(_exchange(streaming, pieces))
    if _escaped:
        raise Failure(_escaped.pop())


_escaped: list[str] = []


def _unexpected(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """An exception from a callback or a future nobody awaited: a failure."""
    exc = context.get("exception")
    _escaped.append(f"{context.get('message')}: {type(exc).__name__}: {exc}" if exc else str(context))


# -- seeds ---------------------------------------------------------------------------------

def seeds() -> list[bytes]:
    body = b'{"choices": [{"message": {"content": "London"}}]}'
    gz = zlib.compress(body, wbits=16 + zlib.MAX_WBITS)
    raw_deflate = zlib.compress(body)[2:-4]
    replies = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(gz), gz),
        b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
        % (len(raw_deflate), raw_deflate),
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\nX-N: 1\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\nETag: \"x\"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\ndata: [DONE]\n\n",
        b"HTTP/1.0 200 OK\r\n\r\nuntil the close",
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nContent-Length: 0\r\n\r\n",
    ]
    inputs = []
    for i, data in enumerate(replies):
        inputs.append(make_input(data))
        inputs.append(make_input(data, streaming=True, cuts=(i * 7 % len(data), len(data) // 2)))
    return inputs


TOKENS = [b"\r\n", b"\r\n\r\n", b"Content-Length: ", b"Transfer-Encoding: chunked\r\n", b"Content-Encoding: gzip\r\n",
          b"Content-Encoding: deflate\r\n", b"Connection: close\r\n", b"Keep-Alive: timeout=", b"HTTP/1.1 ",
          b"HTTP/1.0 ", b"100 Continue", b"0\r\n\r\n", b"ffffffffffffffff", b"99999999999", b"-1", b";", b":",
          b"\x00", b"\xff", b" ", b"\t", b"101 Switching Protocols\r\nUpgrade: h2c\r\n"]


def mutate(rng: random.Random, raw: bytes, pool: list[bytes]) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(data))
        if op == 0 and data:  # flip a bit
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert a token
            data[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and data:  # delete a range
            data[pos:pos + rng.randint(1, 16)] = b""
        elif op == 3 and data:  # duplicate a range
            end = min(len(data), pos + rng.randint(1, 64))
            data[pos:pos] = data[pos:end]
        elif op == 4:  # a random byte
            data[pos:pos] = bytes([rng.randrange(256)])
        elif op == 5:  # splice with another input
            other = rng.choice(pool)
            data = data[:pos] + bytearray(other[rng.randint(0, len(other)):])
        elif op == 6 and len(data) > 5:  # truncate
            del data[rng.randint(5, len(data)):]
        elif op == 7 and len(data) >= 5:  # new cut points / mode
            data[0:5] = bytes([rng.randrange(2)]) + struct.pack(">HH", rng.randrange(512), rng.randrange(512))
    return bytes(data[:8192])


def run_random(seconds: float | None, seed: int, max_runs: int | None = None) -> int:
    rng = random.Random(seed)
    corpus = seeds()
    runs, end = 0, time.monotonic() + (seconds if seconds is not None else float("inf"))
    queue = list(corpus)  # the seeds themselves first
    while time.monotonic() < end and (max_runs is None or runs < max_runs):
        raw = queue.pop() if queue else mutate(rng, rng.choice(corpus), corpus)
        try:
            test_one_input(raw)
        except Failure as exc:
            print(f"FAILURE after {runs} inputs (seed {seed}): {exc}\ninput: {raw!r}", file=sys.stderr)
            return 1
        runs += 1
        if runs % 50 == 0 and len(corpus) < 2000:
            corpus.append(raw)  # keep some mutants: mutations build on mutations
    bound = f"{seconds:g} s" if max_runs is None else f"a bound of {max_runs:,} inputs"
    print(f"random engine: {runs:,} inputs in {bound} (seed {seed}), no failure")
    return 0


def run_atheris(seconds: float | None, seed: int, max_runs: int | None = None) -> int:
    assert atheris is not None
    with tempfile.TemporaryDirectory() as corpus:
        for i, raw in enumerate(seeds()):
            Path(corpus, f"seed{i:03d}").write_bytes(raw)
        artifacts = os.path.join(os.getcwd(), "")
        bounds = ([f"-max_total_time={max(1, int(seconds))}"] if seconds is not None else []) + \
            ([f"-runs={max_runs}"] if max_runs is not None else [])
        argv = [sys.argv[0], *bounds, f"-seed={seed}", "-max_len=8192",
                "-print_final_stats=1", f"-artifact_prefix={artifacts}fuzz-http-reply-", corpus]

        def one(raw: bytes) -> None:
            test_one_input(raw)

        atheris.Setup(argv, one)
        atheris.Fuzz()  # exits the process: 0 when a bound is reached, non-zero on a failure
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: 60 s "
                        "without --runs)")
    parser.add_argument("--runs", type=int, default=None, help="stop after this many inputs (a bound that "
                        "does not depend on the machine's speed or load)")
    parser.add_argument("--engine", choices=("atheris", "random"), default=None,
                        help="default: atheris when installed, else random")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    seconds = 60.0 if args.seconds is None and args.runs is None else args.seconds
    engine = args.engine or ("atheris" if atheris is not None else "random")
    if engine == "atheris":
        if atheris is None:
            print("fuzz_http_reply: error: atheris is not installed (pip install atheris)", file=sys.stderr)
            return 2
        return run_atheris(seconds, args.seed, args.runs)
    return run_random(seconds, args.seed, args.runs)


if __name__ == "__main__":
    sys.exit(main())
