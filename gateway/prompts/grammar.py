"""Grammar compilation for structured outputs and tool calls: limits, a worker pool, a cache.

A constrained request's grammar is compiled here, in the gateway, before the request is queued:
on a bounded pool of worker threads (xgrammar releases the GIL while it compiles), never on the
engine thread or the event loop, so a slow compile makes its own request wait, not the batch.

Hostile tenants: a spec is checked against `GrammarLimits` before it is compiled (size, nesting,
enum members, regex length), and a compile that does not finish within `compile_timeout_s`
answers 400 naming the field. A thread cannot be stopped, so a timed-out compile finishes in the
background; the checks keep that bounded (docs/security.md).

Compiled grammars are cached (cachetools LRU, bounded in bytes) under the canonical spec, the
tokenizer's fingerprint, the vocabulary size and the backend's version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter, Histogram

from weir.engine.errors import InvalidRequestError
from weir.engine.structured.call_closing import ClosingAlphabet, closable
from weir.engine.structured.constraints import CompiledConstraint, ConstraintKind
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend
from weir.engine.structured.worker_priority import lower_thread_priority
from weir.gateway.http.errors import BadRequestError
from weir.gateway.prompts.regex_cost import nested_repeat_depth, nested_repeat_product, wide_split_ways
from weir.gateway.prompts.tokenizer_pool import TokenizerPool

_KINDS = [k.value for k in ConstraintKind]
# Levels `weir.gateway.api.tool_calls.calls_schema` adds above a function's parameters.
_TOOL_CALLS_WRAPPING = 6
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on what a request may ask to compile; each refusal is a 400 naming the field."""

    compile_timeout_s: float = 5.0
    num_workers: int = 2
    cache_bytes: int = 256 * 1024 * 1024
    max_source_bytes: int = 64 * 1024  # a schema (canonical JSON), regex or grammar
    # Nested JSON values of a schema (an object property is 2: `properties`, then the property).
    # Less than the body's own bound (weir.gateway.http.json_body.MAX_JSON_DEPTH), so it is this field
    # that a too deep schema is refused for.
    max_schema_depth: int = 20
    max_enum_values: int = 1024  # enum members plus const values in one schema, in total
    max_regex_chars: int = 2048
    # A counted repetition ({n}, {n,m}) in a regex or a schema's `pattern`: compile time grows
    # with it (xgrammar 0.2.9: [a-z]{1,500} takes 0.9 s on one core).
    max_regex_repeat: int = 256
    # The product of counted repetitions nested in one another, and how many repetitions stack
    # along one path (gateway/prompts/regex_cost.py): what a grammar's masks cost grows with
    # both. ([a-z]{0,64}){0,64} (4,096, two levels) fills a mask in ~30 ms on one core; three
    # levels of {0,8} took 2.7 s (xgrammar 0.2.9).
    max_regex_repeat_product: int = 4096
    max_regex_repeat_depth: int = 2
    # A repeated group ending in a variable count of `.` or a negated class: that count's range
    # times the group's repeats (`wide_split_ways`). (.{0,8}){0,8} (72) took 6.3 s a mask,
    # (.{0,2}){0,8} (24) 0.16 s; found by tests/gateway/prompts/test_grammar_mask_cost.py.
    max_regex_wide_split_ways: int = 32
    max_choices: int = 256

    def __post_init__(self) -> None:
        if not self.compile_timeout_s > 0:
            raise ValueError(f"compile_timeout_s must be > 0, got {self.compile_timeout_s}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        for name in (
            "cache_bytes",
            "max_source_bytes",
            "max_schema_depth",
            "max_enum_values",
            "max_regex_repeat_product",
            "max_regex_repeat_depth",
            "max_regex_wide_split_ways",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _too_complex(param: str, why: str) -> BadRequestError:
    return BadRequestError(f"'{param}' is too complex: {why}", param=param, code="grammar_too_complex")


def check_limits(spec: ConstraintSpec, limits: GrammarLimits) -> None:
    """Refuse a spec larger than the limits before anything compiles it."""
    size = len(spec.source.encode())
    if size > limits.max_source_bytes:
        raise _too_complex(spec.param, f"{size} bytes, at most {limits.max_source_bytes}")
    if spec.kind is ConstraintKind.REGEX:
        _check_regex(spec.source, spec.param, limits)
    if spec.kind is ConstraintKind.CHOICE and len(json.loads(spec.source)) > limits.max_choices:
        raise _too_complex(spec.param, f"more than {limits.max_choices} choices")
    if spec.kind is ConstraintKind.JSON_SCHEMA:
        _check_schema(json.loads(spec.source), spec.param, limits, 0)
    if spec.kind is ConstraintKind.TOOL_CALLS:  # the calls' array wraps each function's parameters
        _check_schema(json.loads(spec.source), spec.param, limits, -_TOOL_CALLS_WRAPPING)


def _check_regex(pattern: str, param: str, limits: GrammarLimits) -> None:
    if len(pattern) > limits.max_regex_chars:
        raise _too_complex(param, f"a regex of {len(pattern)} characters, at most {limits.max_regex_chars}")
    for match in _REPEAT.finditer(pattern):
        if any(int(n) > limits.max_regex_repeat for n in match.groups() if n):
            raise _too_complex(
                param, f"a repetition {match.group(0)} above {limits.max_regex_repeat} in a regex"
            )
    depth = nested_repeat_depth(pattern)
    if depth > limits.max_regex_repeat_depth:
        raise _too_complex(
            param,
            f"{depth} repetitions nested in one another in a regex, at most {limits.max_regex_repeat_depth} "
            "(a repeated group inside a repeated group inside another: its masks cost seconds)",
        )
    ways = wide_split_ways(pattern)
    if ways > limits.max_regex_wide_split_ways:
        raise _too_complex(
            param,
            f"a repeated group ends in a variable count of '.' or a negated class: {ways} ways to split "
            f"its text into items, at most {limits.max_regex_wide_split_ways} (end each item with a fixed "
            "character, e.g. '(.{1,8} ){0,8}', or lower the counts)",
        )
    product = nested_repeat_product(pattern)
    if product > limits.max_regex_repeat_product:
        raise _too_complex(
            param,
            f"nested counted repetitions multiply to {product} copies in a regex, at most "
            f"{limits.max_regex_repeat_product} (each repetition {{m,n}} inside another multiplies its count)",
        )


def _check_schema(schema: Any, param: str, limits: GrammarLimits, start: int) -> None:
    """Depth of nesting and the number of enum / const values, over the whole schema document."""
    num_values = 0
    stack: list[tuple[Any, int]] = [(schema, start)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_schema_depth:
            raise _too_complex(param, f"nested deeper than {limits.max_schema_depth} levels")
        if isinstance(node, dict):
            enum = node.get("enum")
            if isinstance(enum, list):
                num_values += len(enum)
            num_values += "const" in node
            if isinstance(node.get("pattern"), str):
                _check_regex(node["pattern"], param, limits)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        if num_values > limits.max_enum_values:
            raise _too_complex(param, f"more than {limits.max_enum_values} enum and const values")


def _call_openings(spec: ConstraintSpec) -> list[str]:
    """`[{"name": "<function>"` for each function of a tool-call schema (`calls_schema`'s shape)."""
    items = json.loads(spec.source).get("items", {})
    calls = items.get("anyOf", [items]) if isinstance(items, dict) else []
    names = [c.get("properties", {}).get("name", {}).get("const") for c in calls if isinstance(c, dict)]
    return ['[{"name": ' + json.dumps(n, ensure_ascii=False) for n in names if isinstance(n, str)]


class GrammarMetrics:
    """Compile seconds, cache hits and misses, and constrained requests, by constraint kind."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.compile_seconds = Histogram(
            "weir_grammar_compile_seconds",
            "Time to compile a grammar (cache misses), on the worker pool.",
            ["kind"],
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
        )
        self.cache_hits = Counter("weir_grammar_cache_hits", "Grammar cache hits.", ["kind"], registry=r)
        self.cache_misses = Counter(
            "weir_grammar_cache_misses", "Grammar cache misses.", ["kind"], registry=r
        )
        self.constrained = Counter(
            "weir_constrained_requests", "Requests with a constraint, by kind.", ["kind"], registry=r
        )
        for kind in _KINDS:  # every series exists from the start
            self.cache_hits.labels(kind)
            self.cache_misses.labels(kind)
            self.constrained.labels(kind)


def _grammar_bytes(compiled: CompiledConstraint) -> int:
    return max(1, int(getattr(compiled.grammar, "memory_size_bytes", 1)))


class GrammarService:
    """Compiles constraints for the models the gateway serves, off the event loop, with a cache."""

    def __init__(
        self, limits: GrammarLimits | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.limits = limits or GrammarLimits()
        self.metrics = GrammarMetrics(registry)
        # At the lowest CPU priority: a costly compile takes only the CPU the engine leaves idle.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.limits.num_workers,
            thread_name_prefix="weir-grammar",
            initializer=lower_thread_priority,
        )
        # One tenant holds at most half the workers, counted until its compile's thread is done
        # (a timed-out compile still runs): its slow grammars queue behind each other, and never
        # make another tenant's compile wait past its time limit.
        self._share = TokenizerPool(self.limits.num_workers, tenant_share=0.5)
        self._lock = threading.Lock()
        self._cache: LRUCache[tuple[Any, ...], CompiledConstraint] = LRUCache(
            maxsize=self.limits.cache_bytes, getsizeof=_grammar_bytes
        )
        self._backends: dict[tuple[int, int], tuple[Any, GrammarBackend]] = {}
        self._alphabets: dict[str, ClosingAlphabet] = {}  # by tokenizer fingerprint

    def _backend(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> GrammarBackend:
        """The backend of one tokenizer, built once (on a worker: it reads the whole vocabulary)."""
        key = (id(tokenizer), vocab_size)
        with self._lock:
            entry = self._backends.get(key)
        if entry is not None and entry[0] is tokenizer:
            return entry[1]
        try:
            backend = GrammarBackend(tokenizer, vocab_size, stop_token_ids)
        except Exception as exc:  # the backend cannot read this tokenizer: no constraints for it
            raise InvalidRequestError(
                f"structured outputs are not available for this model's tokenizer ({type(exc).__name__})"
            ) from None
        with self._lock:
            self._backends[key] = (tokenizer, backend)  # keeps the tokenizer alive: its id stays unique
        return backend

    def _compile(
        self, spec: ConstraintSpec, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]
    ) -> CompiledConstraint:
        backend = self._backend(tokenizer, vocab_size, stop_token_ids)
        key = (backend.fingerprint, backend.version, vocab_size, spec.kind, spec.source)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            self.metrics.cache_hits.labels(spec.kind.value).inc()
            return cached
        self.metrics.cache_misses.labels(spec.kind.value).inc()
        start = time.perf_counter()
        compiled = backend.compile(spec)
        if spec.kind is ConstraintKind.TOOL_CALLS:
            compiled = self._closable(compiled, tokenizer, backend, spec)
        self.metrics.compile_seconds.labels(spec.kind.value).observe(time.perf_counter() - start)
        with self._lock:
            if _grammar_bytes(compiled) <= self.limits.cache_bytes:
                self._cache[key] = compiled
        return compiled

    def _closable(
        self, compiled: CompiledConstraint, tokenizer: Any, backend: GrammarBackend, spec: ConstraintSpec
    ) -> CompiledConstraint:
        """A tool-call grammar the engine can close before `max_tokens` (`weir.engine.structured.call_closing`)."""
        with self._lock:
            alphabet = self._alphabets.get(backend.fingerprint)
        if alphabet is None:
            alphabet = ClosingAlphabet.of(tokenizer)
            with self._lock:
                self._alphabets[backend.fingerprint] = alphabet
        result = closable(compiled, alphabet, _call_openings(spec))
        if result is None:
            raise InvalidRequestError(
                f"'{spec.param}' admits no short complete call: a call of these functions cannot be closed "
                "within a bounded number of tokens",
                spec.param,
            )
        return result

    async def compile(
        self,
        spec: ConstraintSpec,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int] = (),
        tenant_id: str = "",
    ) -> CompiledConstraint:
        """The compiled grammar of `spec` for this tokenizer: from the cache, or compiled on a worker.

        Raises BadRequestError (400, naming `spec.param`) for a spec over the limits, one the
        backend refuses, or one that does not compile within `compile_timeout_s`.
        """
        check_limits(spec, self.limits)
        self.metrics.constrained.labels(spec.kind.value).inc()
        await self._share.acquire(tenant_id)  # waits in the tenant's own line, outside the time limit
        try:
            running = asyncio.wrap_future(
                self._pool.submit(self._compile, spec, tokenizer, vocab_size, stop_token_ids)
            )
        except BaseException:
            self._share.release(tenant_id)
            raise
        running.add_done_callback(lambda _: self._share.release(tenant_id))  # once its thread is done
        try:
            return await asyncio.wait_for(asyncio.shield(running), self.limits.compile_timeout_s)
        except TimeoutError:  # the compile finishes in the background, holding the tenant's worker
            raise _too_complex(
                spec.param, f"it did not compile within {self.limits.compile_timeout_s:g} s"
            ) from None
        except InvalidRequestError as exc:
            raise BadRequestError(
                exc.message, param=exc.param or spec.param, code="invalid_grammar"
            ) from None

    def close(self) -> None:
        """Stop the workers (running compiles finish; queued ones are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
