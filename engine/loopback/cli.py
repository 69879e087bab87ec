"""The loopback server standalone, for benchmarks in another process:
`python -m engine.loopback [options]` (also `tulving serve-loopback`).

Contract: `main(argv)` parses the options into a `LoopbackServer`, serves
until SIGINT/SIGTERM, prints the two base URLs first (`openai_base_url=...`,
`anthropic_base_url=...`) and a one-line summary last; exit 0, or 2 with one
line on stderr for a bad option.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
from collections.abc import Sequence

from engine.loopback.batches import BatchKnobs
from engine.loopback.compat import FLAVOURS
from engine.loopback.limits import WINDOW_KINDS
from engine.loopback.server import FAULT_KINDS, Faults, LatencyFn, LoopbackServer, constant, lognormal, uniform


def _parse_args(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Serve the OpenAI and Anthropic HTTP APIs on loopback "
                                                 "(tests and benchmarks).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--rpm", type=float)
    parser.add_argument("--input-tpm", type=float)
    parser.add_argument("--output-tpm", type=float)
    parser.add_argument("--tpm", type=float, help="tokens per minute counting prompt + max_tokens (OpenAI's TPM)")
    parser.add_argument("--burst-seconds", type=float, default=1.0)
    parser.add_argument("--window", choices=list(WINDOW_KINDS), default="bucket",
                        help="how limits are enforced: token buckets of --burst-seconds, or sliding windows "
                             "(a second's share in any 1 s, a minute's in any 60 s)")
    parser.add_argument("--limit-headers", choices=["minute", "none"], default="minute",
                        help="rate-limit headers on the per-minute basis (as the APIs report them), or none")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="median latency per call")
    parser.add_argument("--latency", choices=["constant", "uniform", "lognormal"], default="constant",
                        help="distribution around --latency-ms, --ttft-ms and --token-delay-ms "
                             "(uniform: 0..2x; lognormal: sigma 0.5)")
    parser.add_argument("--ttft-ms", type=float, default=0.0,
                        help="median time to first token (streams; else a whole reply's wait with --token-delay-ms)")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="median gap between streamed tokens")
    parser.add_argument("--cache-min-tokens", type=int, default=1024,
                        help="shortest prompt prefix the provider prompt caches keep")
    parser.add_argument("--cache-ttl", type=float, default=300.0, help="prompt cache lifetime (s)")
    parser.add_argument("--batch-polls", type=int, default=3, help="status polls until a batch ends")
    parser.add_argument("--batch-fail-share", type=float, default=0.0, help="share of batch lines failing (500)")
    parser.add_argument("--batch-expire-after", type=float, metavar="SHARE",
                        help="batches expire with this share of their lines done")
    parser.add_argument("--batch-in-order", action="store_true", help="batch results in input order")
    parser.add_argument("--batch-fail-status", type=int, default=500,
                        help="status of the failing batch lines (402: Anthropic's billing_error)")
    parser.add_argument("--batch-fail-type", help="Anthropic error type of the failing batch lines")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--tokens", choices=["cheap", "cl100k"], default="cheap")
    parser.add_argument("--context-tokens", type=int)
    parser.add_argument("--fault", action="append", default=[], metavar="KIND=P",
                        help=f"per-call fault probability, e.g. 503=0.01 (kinds: {', '.join(sorted(FAULT_KINDS))})")
    parser.add_argument("--fail-first", metavar="N:KIND", help="fail the first N calls with KIND, e.g. 5:503")
    parser.add_argument("--try-again-ms", type=float, default=644.0,
                        help="the wait a '429' fault names (OpenAI: 'Please try again in 644ms.' only)")
    parser.add_argument("--should-retry", choices=["true", "false"],
                        help="faults' error replies carry x-should-retry with this value")
    parser.add_argument("--models", metavar="ID1,ID2",
                        help="add these model ids to the ones served; without it only the built-in registry's "
                             "current ids are served (any other id: the real API's 404)")
    _add_gemini_faults(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    parser.add_argument("--compat", choices=list(FLAVOURS),
                        help="answer chat calls with a service's quirks (deepseek, openrouter, azure)")
    parser.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    parser.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    return args


def _add_gemini_faults(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gemini-batch-drop-keys", action="store_true",
                        help="Gemini batch results leave out their request's key (a reported fault of the real "
                             "API, googleapis/python-genai#2008)")
    parser.add_argument("--gemini-batch-reorder", action="store_true",
                        help="Gemini batch results come in reverse order of their requests (python-genai#1909)")


def _distribution(kind: str, milliseconds: float, seed: int) -> LatencyFn | None:
    median = milliseconds / 1000.0
    if median <= 0:
        return None
    return {"constant": lambda: constant(median), "uniform": lambda: uniform(0.0, 2 * median, seed),
            "lognormal": lambda: lognormal(median, 0.5, seed)}[kind]()


def _server_from_args(args: argparse.Namespace) -> LoopbackServer:
    latency = _distribution(args.latency, args.latency_ms, args.seed)
    rates = {}
    for item in args.fault:
        kind, _, p = item.partition("=")
        rates[kind] = float(p)
    schedule: list[str] = []
    if args.fail_first:
        n, _, kind = args.fail_first.partition(":")
        schedule = [kind] * int(n)
    ssl_context = None
    if args.tls_cert:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load --tls-cert/--tls-key: {exc}") from None
    batch = BatchKnobs(polls=args.batch_polls, fail_share=args.batch_fail_share, expire_after=args.batch_expire_after,
                       shuffle=not args.batch_in_order, seed=args.seed, fail_status=args.batch_fail_status,
                       fail_type=args.batch_fail_type)
    server = LoopbackServer(latency=latency, ttft=_distribution(args.latency, args.ttft_ms, args.seed),
                          token_delay=_distribution(args.latency, args.token_delay_ms, args.seed + 1),
                          cache_min_tokens=args.cache_min_tokens, cache_ttl=args.cache_ttl, batch=batch,
                          rpm=args.rpm, input_tpm=args.input_tpm, output_tpm=args.output_tpm,
                          burst_seconds=args.burst_seconds, tpm=args.tpm, window=args.window,
                          limit_headers=args.limit_headers == "minute", faults=Faults(schedule=schedule, rates=rates,
                                                                          seed=args.seed,
                                                                          try_again=args.try_again_ms / 1000.0,
                                                                          should_retry=args.should_retry),
                          embed_dim=args.embed_dim, tokens=args.tokens, context_tokens=args.context_tokens,
                          models=args.models.split(",") if args.models else None,
                          compat=args.compat, host=args.host, port=args.port, ssl_context=ssl_context)
    server.gemini.batch_drop_keys = args.gemini_batch_drop_keys
    server.gemini.batch_reorder = args.gemini_batch_reorder
    return server


async def _serve_forever(server: LoopbackServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"openai_base_url={server.openai_base_url}", flush=True)
        print(f"anthropic_base_url={server.anthropic_base_url}", flush=True)
        await stop.wait()
        stats = server.stats
        print(f"served {stats.requests} calls, status {dict(stats.by_status)}, "
              f"max in flight {stats.max_in_flight}", flush=True)


def main(argv: Sequence[str] | None = None, prog: str = "python -m engine.loopback") -> int:
    """`prog`: the command the usage names (`tulving serve-loopback` from the CLI)."""
    try:
        args = _parse_args(argv, prog)
        server = _server_from_args(args)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.uvloop:
        import uvloop
        uvloop.run(_serve_forever(server))
    else:
        asyncio.run(_serve_forever(server))
    return 0
