"""The hot path shared by the HTTP providers: POST a JSON body, get a JSON dict.

orjson for the bodies; the official SDKs cost 10-20x more CPU per call. The
HTTP itself goes through `providers.http_pool.HttpPool` (httptools-parsed
keep-alive connections, less than half of aiohttp.ClientSession's CPU per
call), or through an `aiohttp.ClientSession` for endpoints that need what the
pool does not do: a proxy from the environment (`trust_env = true`), or
`http_client = "aiohttp"` in the endpoint's options. Either way at most
max_concurrency calls are in flight, no retries happen here (the engine owns
them) and every failure leaves as a classified `ProviderError` (see
providers/http_errors.py).

`JsonHttpClient.stream` is the streamed twin of `post` (server-sent events):
the reply's body pieces as they arrive, with the time of its first byte, the
same error classification, and the connection dropped (never reused) when the
body is not read to its end (cancelled, or an error mid-stream).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from collections.abc import Mapping as MappingABC
from time import perf_counter
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp.client_proto import ResponseHandler
from aiohttp.tracing import Trace

from providers import transport
from providers.base import CONFIG, EndpointSpec, Provider, ProviderError, holds_long_string, with_long_strings_copied
from providers.http_errors import bad_reply, exception_error, redact, status_error
from providers.http_pool import TIMEOUT_OPTIONS, HttpConfigError, HttpPool, merged_headers
from providers.standard_kinds import HTTP_CLIENTS

_USER_AGENT = "tulving/0.1"
LONG_TEXT_CHARS = 65_536  # strings longer than this are serialised from a copy (see _body_bytes)


class StatusClassifier(Protocol):
    """Classifies a non-2xx reply: `status_error` unless a kind's wire needs its
    own (Gemini's google.rpc error bodies: providers/gemini_errors.py)."""

    def __call__(self, status: int, body: bytes, headers: Mapping[str, str], *, endpoint: str,
                 secret: str | None, request_id: str | None = None) -> ProviderError: ...


def _body_bytes(body: Mapping[str, object]) -> bytes:
    """The JSON body to send. A book-sized prompt is serialised from a copy,
    so the prompt itself keeps no UTF-8 copy of the book while it is held."""
    if not holds_long_string(body, LONG_TEXT_CHARS):
        return orjson.dumps(body, default=_plain)
    return orjson.dumps(with_long_strings_copied(body, LONG_TEXT_CHARS), default=_plain)


def _plain(value: object) -> object:
    """orjson fallback for the non-builtin containers callers may pass
    (MappingProxyType, custom sequences); called only for those."""
    if isinstance(value, MappingABC):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Iterable):
        return list(value)
    raise TypeError(f"cannot send {type(value).__name__} as JSON")


def _abandon(session: aiohttp.ClientSession) -> None:
    """Drop a session whose event loop is gone: it cannot be awaited closed
    any more, so drop its sockets now (best effort) and mark it closed."""
    connector = session.connector
    session.detach()
    close_now = getattr(connector, "_close", None)  # the synchronous part of connector.close()
    if close_now is not None:
        try:
            close_now(abort_ssl=True)
        except (RuntimeError, TypeError):
            pass


def join_url(base: str, path: str) -> str:
    """`base` with `path` appended to its path; its query string is kept after."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, parts.query, ""))


class JsonHttpClient:
    """POSTs JSON to one server. `headers` are sent with every call (auth
    included); `secret` is scrubbed from every error message. `http_client`
    is "pool" (providers/http_pool.py) or "aiohttp"; `trust_env` (proxies from
    the environment) needs aiohttp. `timeouts` are the endpoint's
    TIMEOUT_OPTIONS (HttpPool's keywords; aiohttp takes `connect_timeout`,
    `read_timeout` and `keepalive_timeout` as its `connect`, `sock_read` and
    keep-alive time, and has no first-byte limit of its own)."""

    def __init__(self, *, endpoint: str, max_concurrency: int, headers: Mapping[str, str],
                 secret: str | None, request_id_header: str, trust_env: bool = False,
                 http_client: str = "pool", timeouts: Mapping[str, float] | None = None,
                 classify: StatusClassifier = status_error):
        if http_client not in HTTP_CLIENTS:
            raise ProviderError(CONFIG, f"endpoint {endpoint!r}: unknown http_client {http_client!r} "
                                        f"(known: {', '.join(HTTP_CLIENTS)})")
        self.endpoint = endpoint
        self._limit = max(1, int(max_concurrency))
        self._headers = merged_headers({"Content-Type": "application/json", "Accept": "application/json",
                                        "User-Agent": _USER_AGENT}, headers)
        self._secret = secret
        self._request_id_header = request_id_header
        self._trust_env = trust_env
        self.uses_aiohttp = trust_env or http_client == "aiohttp"
        self._pool: HttpPool | None = None
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._pool_options: dict[str, Any] = dict(timeouts or {})
        self._classify = classify

    @classmethod
    def for_endpoint(cls, spec: EndpointSpec, api_key: str | None, *, auth: Mapping[str, str],
                     base_headers: Mapping[str, str] | None = None, request_id_header: str,
                     classify: StatusClassifier = status_error) -> JsonHttpClient:
        """The client of one provider endpoint: its base headers, the
        endpoint's extra `headers` option, then `auth` (only when a key is set)."""
        from providers.kinds import opt_bool, opt_float, opt_str, opt_table

        headers = {**(base_headers or {}), **opt_table(spec, "headers"), **(auth if api_key else {})}
        timeouts = {name: opt_float(spec, name) for name in TIMEOUT_OPTIONS}
        return cls(endpoint=spec.name, max_concurrency=spec.max_concurrency, headers=headers, secret=api_key,
                   request_id_header=request_id_header, trust_env=opt_bool(spec, "trust_env"),
                   http_client=opt_str(spec, "http_client") or "pool", classify=classify,
                   timeouts={name: seconds for name, seconds in timeouts.items() if seconds is not None})

    async def post(self, url: str, body: Mapping[str, object], timeout: float
                   ) -> tuple[dict[str, Any], Mapping[str, str], float]:
        """POST `body`; return (parsed JSON object, reply headers, latency in s).
        Header names are lower-case keys with the pool; look them up lower-case."""
        payload = _body_bytes(body)
        start = perf_counter()
        try:
            if self.uses_aiohttp:
                status, headers, raw = await self._post_aiohttp(url, payload, timeout)
            else:
                pool = self._pool or self._pool_of()
                status, headers, raw = await pool.post(url, payload, timeout)
        except HttpConfigError as exc:
            raise ProviderError(CONFIG, redact(f"{self.endpoint}: {exc}", self._secret)) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise exception_error(exc, endpoint=self.endpoint, timeout=timeout, secret=self._secret) from exc
        latency = perf_counter() - start
        if not 200 <= status < 300:
            raise self._classify(status, raw, headers, endpoint=self.endpoint, secret=self._secret,
                               request_id=headers.get(self._request_id_header))
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise bad_reply(self.endpoint, f"HTTP {status} reply is not JSON ({len(raw)} bytes)",
                            secret=self._secret, status=status,
                            request_id=headers.get(self._request_id_header)) from None
        if not isinstance(data, dict):
            raise bad_reply(self.endpoint, f"HTTP {status} reply is JSON but not an object",
                            secret=self._secret, status=status)
        return data, headers, latency

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: Mapping[str, object], timeout: float) -> AsyncIterator[StreamReply]:
        """POST `body` and read the reply as it arrives:

            async with client.stream(url, body, timeout) as reply:
                async for piece in reply:   # body bytes; a failure raises a classified ProviderError
                    ...

        A non-2xx reply raises (`status_error`) before anything is yielded.
        `timeout` bounds the whole call, the body's last byte included. On
        leaving the block the connection is released, or dropped when the
        body was not read to its end (an error, a cancel)."""
        payload = _body_bytes(body)
        start = perf_counter()
        try:
            if self.uses_aiohttp:
                source: _StreamSource = await self._stream_aiohttp(url, payload, timeout)
            else:
                source = await self._pool_of().post_stream(url, payload, timeout)
        except (HttpConfigError, TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failed(exc, timeout) from exc
        try:
            status, headers = source.status, source.headers
            if not 200 <= status < 300:
                try:
                    raw = await source.read()
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    raise self._failed(exc, timeout) from exc
                raise self._classify(status, raw, headers, endpoint=self.endpoint, secret=self._secret,
                                   request_id=headers.get(self._request_id_header))
            yield StreamReply(self, source, start, timeout)
        finally:
            await source.aclose()

    def _failed(self, exc: BaseException, timeout: float) -> ProviderError:
        if isinstance(exc, HttpConfigError):
            return ProviderError(CONFIG, redact(f"{self.endpoint}: {exc}", self._secret))
        return exception_error(exc, endpoint=self.endpoint, timeout=timeout, secret=self._secret)

    def _pool_of(self) -> HttpPool:
        pool = self._pool
        if pool is None:
            pool = self._pool = HttpPool(limit=self._limit, headers=self._headers, **self._pool_options)
        return pool

    # -- the aiohttp client -------------------------------------------------------------
    async def _stream_aiohttp(self, url: str, payload: bytes, timeout: float) -> _AiohttpStream:
        session = self._session
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            session = self._open_session(url)
        response = await session.post(url, data=payload, timeout=self._timeout(timeout))
        return _AiohttpStream(response, perf_counter())

    async def _post_aiohttp(self, url: str, payload: bytes, timeout: float
                            ) -> tuple[int, Mapping[str, str], bytes]:
        session = self._session
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            session = self._open_session(url)
        async with session.post(url, data=payload, timeout=self._timeout(timeout)) as resp:
            return resp.status, resp.headers, await resp.read()

    def _open_session(self, url: str) -> aiohttp.ClientSession:
        # A session belongs to the loop it was created in: reopen when called
        # from another loop (e.g. successive asyncio.run calls).
        if self._session is not None and not self._session.closed:
            _abandon(self._session)
        self._loop = asyncio.get_running_loop()
        keepalive = self._pool_options.get("keepalive_timeout", 30.0)
        connector: aiohttp.BaseConnector
        if transport.mounted(transport.origin_of(url)):  # a server in this process (providers/transport.py)
            connector = _InProcessConnector(limit=self._limit, limit_per_host=0, keepalive_timeout=keepalive)
        else:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, keepalive_timeout=keepalive)
        # The headers are the session's defaults: merged in C-backed multidicts
        # once per call rather than converted from a dict each time.
        self._session = aiohttp.ClientSession(connector=connector, trust_env=self._trust_env,
                                              headers=self._headers)
        return self._session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        found = self._timeouts.get(seconds)
        if found is None:
            options = self._pool_options
            found = aiohttp.ClientTimeout(total=seconds, connect=options.get("connect_timeout"),
                                          sock_read=options.get("read_timeout"))
            if len(self._timeouts) < 64:  # calls under a deadline each get their own value
                self._timeouts[seconds] = found
        return found

    # -- control-plane calls (batch APIs): any method, raw bytes ------------------------
    async def request_bytes(self, method: str, url: str, *, body: bytes | None = None,
                            content_type: str = "application/json", timeout: float = 600.0,
                            accept: str | None = None, headers: Mapping[str, str] | None = None
                            ) -> tuple[bytes, Mapping[str, str]]:
        """One control-plane call (GET, an upload step, a batch's JSONL:
        `accept` then replaces the client's `Accept: application/json`;
        `headers` are added to the call, e.g. an upload protocol's): rare,
        so it goes through aiohttp whatever `http_client` says. Returns (body
        bytes, headers) of a 2xx reply; anything else raises a classified
        ProviderError with the key scrubbed."""
        session = self._session
        if session is None or session.closed or self._loop is not asyncio.get_running_loop():
            session = self._open_session(url)
        sent = {"Content-Type": content_type} if body is not None else {}
        if accept is not None:
            sent["Accept"] = accept
        sent.update(headers or {})
        try:
            async with session.request(method, url, data=body, headers=sent,
                                       timeout=self._timeout(timeout)) as resp:
                status, reply_headers, raw = resp.status, resp.headers, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise exception_error(exc, endpoint=self.endpoint, timeout=timeout, secret=self._secret) from exc
        if not 200 <= status < 300:
            raise self._classify(status, raw, reply_headers, endpoint=self.endpoint, secret=self._secret,
                               request_id=reply_headers.get(self._request_id_header))
        return raw, reply_headers

    async def request_json(self, method: str, url: str, *, body: bytes | None = None,
                           content_type: str = "application/json", timeout: float = 600.0) -> dict[str, Any]:
        """`request_bytes`, its reply parsed as a JSON object (else a bad reply)."""
        raw, _ = await self.request_bytes(method, url, body=body, content_type=content_type, timeout=timeout)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise bad_reply(self.endpoint, f"{method} {urlsplit(url).path}: reply is not JSON ({len(raw)} bytes)",
                            secret=self._secret) from None
        if not isinstance(data, dict):
            raise bad_reply(self.endpoint, f"{method} {urlsplit(url).path}: reply is JSON but not an object",
                            secret=self._secret)
        return data

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                await session.close()
            except RuntimeError:  # its loop is gone; nothing left to release
                pass


class _InProcessConnector(aiohttp.BaseConnector):
    """aiohttp's connections to an in-process server (providers/transport.py)."""

    async def _create_connection(self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
                                 ) -> ResponseHandler:
        url = req.url
        protocol = self._factory()
        transport.connect((url.scheme, url.host or "", url.port or 80), protocol)
        return protocol


class _StreamSource(Protocol):
    """A streamed reply as the HTTP clients give it: the pool's PooledStream
    (providers/http_pool.py), or `_AiohttpStream`."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # looked up by lower-case name
    @property
    def first_byte(self) -> float: ...           # perf_counter() when the reply's first byte arrived

    def __aiter__(self) -> AsyncIterator[bytes]: ...
    async def read(self) -> bytes: ...
    async def aclose(self) -> None: ...


class _AiohttpStream:
    """An aiohttp reply in the pool's PooledStream shape."""

    __slots__ = ("_response", "status", "headers", "first_byte")

    def __init__(self, response: aiohttp.ClientResponse, first_byte: float):
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers  # case-insensitive
        self.first_byte = first_byte

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any().__aiter__()

    async def read(self) -> bytes:
        return await self._response.read()

    async def aclose(self) -> None:
        response = self._response
        if response.content.at_eof():
            response.release()  # read to its end: the connection may serve the next call
        else:
            response.close()    # cut short: a late rest of the body must not reach the next call


class StreamReply:
    """A 2xx streamed reply (see `JsonHttpClient.stream`): iterate it for the
    body's pieces. `start` is perf_counter() before the call was sent,
    `first_byte` when its first byte arrived."""

    __slots__ = ("_client", "_source", "_pieces", "_timeout", "headers", "start", "first_byte")

    def __init__(self, client: JsonHttpClient, source: _StreamSource, start: float, timeout: float):
        self._client = client
        self._source = source
        self._pieces: AsyncIterator[bytes] | None = None
        self._timeout = timeout
        self.headers = source.headers
        self.start = start
        self.first_byte = source.first_byte

    def __aiter__(self) -> StreamReply:
        self._pieces = self._source.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._pieces is not None  # iterated through __aiter__
        try:
            return await self._pieces.__anext__()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._client._failed(exc, self._timeout) from exc


class HttpProvider(Provider):
    """What the JSON-over-HTTP providers share: a base URL (the endpoint's, or
    `default_base_url`), one `JsonHttpClient` in `self._http`, and aiohttp's
    total timeout bounding every call."""

    default_base_url = ""
    enforces_timeout = True  # the engine need not wrap calls in a timer of its own
    _http: JsonHttpClient

    @property
    def http(self) -> JsonHttpClient:
        """The endpoint's client (auth and headers set): the batch wires reuse it."""
        return self._http

    def base_url(self) -> str:
        return (self.spec.base_url or self.default_base_url).rstrip("/")

    def url(self, path: str) -> str:
        """The endpoint's base URL with `path` appended to its path (before
        a query string, which is kept: `https://h/v1?api-version=x`)."""
        return join_url(self.spec.base_url or self.default_base_url, path)

    async def aclose(self) -> None:
        await self._http.aclose()
