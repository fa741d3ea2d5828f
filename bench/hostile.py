"""The hostile and careless inputs of issue 10, as a client sends them, and a timed stream.

`HOSTILE` lists one `Probe` per defect input (huge seeds, a prompt that can never fit the KV
pool, bogus keys from the same address, beam_width 16, no max_tokens, lone surrogates, deep
JSON, /metrics without the admin token, a stream cancelled after its first chunk); `FLOODS` the
floods of issue 21 (a new random key id each request; unknown paths with the victim's key id). `send`
sends one and returns the HTTP status (0: a cancel by the client, -1: a transport error), so a
benchmark can loop them and count 5xx. `timed_stream` is the well-behaved request whose time to
first token the benchmarks measure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from weir.tenancy.keys.keys import KEY_PREFIX, generate_key
from weir_bench.sse import DONE, ChunkError, SSEDecoder, parse_chunk

CANCELLED = 0
TRANSPORT_ERROR = -1


@dataclass(frozen=True)
class Target:
    """What a probe needs to know about the server."""

    url: str
    model: str
    key: str
    kv_cache_tokens: int  # the pool a can-never-fit prompt must exceed
    victim_key_id: str = ""  # the victim's public key id, for the flood that presents it

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}", "content-type": "application/json"}


@dataclass(frozen=True)
class Probe:
    """One hostile input: `build` gives (path, headers, raw body) for a target."""

    name: str
    defect: str
    build: Callable[[Target], tuple[str, dict[str, str], bytes]]
    stream_then_cancel: bool = False


def _json(path: str, body: str) -> Callable[[Target], tuple[str, dict[str, str], bytes]]:
    """A raw JSON body (lone surrogates must reach the server as written); `{model}` is filled in."""

    def build(t: Target) -> tuple[str, dict[str, str], bytes]:
        return path, t.auth, body.replace("{model}", t.model).encode()

    return build


def _never_fits(t: Target) -> tuple[str, dict[str, str], bytes]:
    # About one token per word: the prompt alone is ~90% of the pool, max_tokens the rest and more.
    words = " ".join(["fit"] * int(t.kv_cache_tokens * 0.9))
    body = f'{{"model": "{t.model}", "prompt": "{words}", "max_tokens": {t.kv_cache_tokens // 4}}}'
    return "/v1/completions", t.auth, body.encode()


def _bogus_key(t: Target) -> tuple[str, dict[str, str], bytes]:
    headers = {**t.auth, "authorization": "Bearer sk-weir-bogus0000000000000000000000000000"}
    return "/v1/chat/completions", headers, f'{{"model": "{t.model}", "messages": []}}'.encode()


def _metrics_without_token(t: Target) -> tuple[str, dict[str, str], bytes]:
    return "/metrics", t.auth, b""


def _deep_json(t: Target) -> tuple[str, dict[str, str], bytes]:
    return "/v1/chat/completions", t.auth, b"[" * 100_000


_CHAT = '{"model": "{model}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4'
HOSTILE: tuple[Probe, ...] = (
    Probe("seed_2_64", "1", _json("/v1/chat/completions", _CHAT + ', "seed": 18446744073709551616}')),
    Probe("seed_minus_2_64", "1", _json("/v1/chat/completions", _CHAT + ', "seed": -18446744073709551616}')),
    Probe(
        "n2_seed_max", "1", _json("/v1/chat/completions", _CHAT + ', "n": 2, "seed": 18446744073709551615}')
    ),
    Probe("never_fits", "2", _never_fits),
    Probe("bogus_key", "3", _bogus_key),
    Probe(
        "beam_16",
        "4",
        _json(
            "/v1/completions",
            '{"model": "{model}", "prompt": "beam", "use_beam_search": true, "beam_width": 16, "max_tokens": 24}',
        ),
    ),
    Probe(
        "surrogate_chat",
        "5",
        _json(
            "/v1/chat/completions",
            '{"model": "{model}", "messages": [{"role": "user", "content": "\\ud800"}]}',
        ),
    ),
    Probe("surrogate_prompt", "5", _json("/v1/completions", '{"model": "{model}", "prompt": "a\\ud800b"}')),
    Probe("surrogate_model", "5", _json("/v1/completions", '{"model": "\\ud800", "prompt": "x"}')),
    Probe("deep_json", "5", _deep_json),
    Probe("metrics_without_admin", "7", _metrics_without_token),
    Probe(
        "no_max_tokens",
        "8",
        _json(
            "/v1/chat/completions", '{"model": "{model}", "messages": [{"role": "user", "content": "go on"}]}'
        ),
    ),
    Probe(
        "stream_cancel",
        "cancel",
        _json(
            "/v1/chat/completions", _CHAT.replace('"max_tokens": 4', '"max_tokens": 64') + ', "stream": true}'
        ),
        stream_then_cancel=True,
    ),
)


def _random_key_id(t: Target) -> tuple[str, dict[str, str], bytes]:
    # A well-formed key with a new random id each time: no cache can have seen it.
    headers = {**t.auth, "authorization": f"Bearer {generate_key().key}"}
    return "/v1/chat/completions", headers, _CHAT.replace("{model}", t.model).encode() + b"}"


def _unknown_path_victim_id(t: Target) -> tuple[str, dict[str, str], bytes]:
    # The victim's public key id (it is in logs and usage records) with a secret of our own.
    secret = generate_key().key.rsplit("-", 1)[1]
    headers = {**t.auth, "authorization": f"Bearer {KEY_PREFIX}{t.victim_key_id}-{secret}"}
    return "/v1/no-such-path", headers, b"{}"


# The floods of issue 21 (item 2), each sent from many connections at once.
FLOODS: tuple[Probe, ...] = (
    Probe("random_key_ids", "21.2", _random_key_id),
    Probe("unknown_paths_victim_id", "21.2", _unknown_path_victim_id),
)


async def send(client: httpx.AsyncClient, probe: Probe, target: Target) -> int:
    """Send one probe; its HTTP status, CANCELLED after a cancel, TRANSPORT_ERROR on a broken connection."""
    path, headers, body = probe.build(target)
    method = "GET" if path == "/metrics" else "POST"
    try:
        if probe.stream_then_cancel:
            async with client.stream(method, target.url + path, headers=headers, content=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return r.status_code
                async for _ in r.aiter_raw():
                    return CANCELLED  # closing the stream after the first bytes cancels it
            return r.status_code
        r = await client.request(method, target.url + path, headers=headers, content=body or None)
        return r.status_code
    except httpx.TransportError:
        return TRANSPORT_ERROR


@dataclass(frozen=True)
class StreamResult:
    """One well-behaved streamed request: status, whether it ended with [DONE], times in seconds."""

    status: int
    complete: bool
    ttft_s: float | None
    e2e_s: float
    started_s: float  # time.monotonic() at the start
    model_version: str | None = None  # the answer's x-weir-model-version header
    itl_s: tuple[float, ...] = ()  # gaps between consecutive chunks with content


async def timed_stream(
    client: httpx.AsyncClient, url: str, key: str, body: dict[str, object]
) -> StreamResult:
    """POST a streaming chat completion and time its first content token and its end."""
    start = time.monotonic()
    ttft: float | None = None
    last: float | None = None
    gaps: list[float] = []
    done = False
    version: str | None = None
    try:
        headers = {"authorization": f"Bearer {key}"}
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            version = r.headers.get("x-weir-model-version")
            if r.status_code != 200:
                await r.aread()
                return StreamResult(r.status_code, False, None, time.monotonic() - start, start, version)
            decoder = SSEDecoder()
            async for line in r.aiter_lines():
                data = decoder.feed(line)
                if data is None:
                    continue
                if data == DONE:
                    done = True
                elif parse_chunk(data).has_content:
                    now = time.monotonic()
                    if last is None:
                        ttft = now - start
                    else:
                        gaps.append(now - last)
                    last = now
            return StreamResult(200, done, ttft, time.monotonic() - start, start, version, tuple(gaps))
    except ChunkError:  # an error event inside the stream: the request failed after its 200
        return StreamResult(200, False, ttft, time.monotonic() - start, start, version, tuple(gaps))
    except httpx.TransportError:
        return StreamResult(TRANSPORT_ERROR, False, None, time.monotonic() - start, start, version)
