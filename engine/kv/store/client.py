"""The shared KV store's I/O: fetch threads and a write thread over Redis/Valkey, off the engine step.

- The **fetch threads** (three, each with its own connection, so one slow fetch does not hold
  every other) take one fetch at a time each: a request's chain of block keys, read with one
  pipelined round of MGETs. Each value is unsealed (`weir.engine.kv.store.codec`: a wrong
  length or a bad MAC is counted and ends the chain: nothing after it is trusted), and the
  verified payloads are queued for the engine thread (`poll`), which is woken (`on_ready`).
  Fetches wait in a bounded `FairQueue` (`weir.engine.kv.store.fair_queue`) per tenant: a tenant
  has at most all threads but one at once, the tenant with the fewest running goes next, a full
  queue refuses (the request recomputes, counted), and a fetch whose request is gone is
  cancelled before it runs (`cancel`).
- The **write thread** drains a bounded `FairQueue` of blocks to write, per cache scope.
  `write` never blocks: a scope's full share, or a full queue where that scope's backlog is the
  longest, drops the block (counted per scope), so a slow store or a flooding tenant can never
  hold the engine, grow memory or take another scope's room. Each batch is sealed and written
  per scope index by one Lua script: SET with a TTL, the key added to the scope's index, entries
  past the TTL forgotten, and the scope's oldest entries evicted past its cap. Flushes (admin,
  version retirement) run on this thread too, never dropped.

Both ask the circuit breaker before a call and report its outcome; an open breaker turns
fetches into misses and drops writes. Every call has a socket timeout, so a stalled
(SIGSTOPped) store costs at most that; `close` never waits longer than that either. No torch here.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from weir.engine.config import KVStoreConfig
from weir.engine.kv.store.circuit_breaker import CircuitBreaker
from weir.engine.kv.store.codec import FetchResult, StoreWrite, UnsealError, seal, unseal
from weir.engine.kv.store.fair_queue import FairQueue
from weir.engine.kv.store.stats import FETCH_LATENCY_BUCKETS_S, BreakerState, StoreCounters

logger = logging.getLogger("weir.engine")

# Fetches read at once (each thread its own connection): one slow fetch does not hold the others,
# and a tenant may hold all threads but one, so another tenant's fetch starts at once.
_FETCH_THREADS = 3
_MAX_RUNNING_FETCHES_PER_TENANT = max(1, _FETCH_THREADS - 1)
# Fetches queued at once, and per tenant (more are refused: their requests recompute).
_MAX_QUEUED_FETCHES = 64
_MAX_QUEUED_FETCHES_PER_TENANT = 8
# Keys per MGET of a fetch's pipeline, and blocks per write script call.
_FETCH_CHUNK = 16
_WRITE_BATCH = 16
# KEYS[1]: the scope's index. ARGV: ttl s, cap (entries), now (ms), then key, value pairs.
# Returns {entries evicted, entries in the index now}.
_WRITE_SCRIPT = """
local idx = KEYS[1]
local ttl = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', idx, '-inf', now - ttl * 1000)
for i = 4, #ARGV, 2 do
  redis.call('SET', ARGV[i], ARGV[i + 1], 'EX', ttl)
  redis.call('ZADD', idx, now, ARGV[i])
end
redis.call('EXPIRE', idx, ttl)
local evicted = 0
local n = redis.call('ZCARD', idx)
if n > cap then
  local old = redis.call('ZPOPMIN', idx, n - cap)
  for i = 1, #old, 2 do
    redis.call('DEL', old[i])
    evicted = evicted + 1
  end
end
return {evicted, redis.call('ZCARD', idx)}
"""


class KVStoreClient:
    """The store's fetch and write threads; thread-safe entry points for the engine thread."""

    def __init__(
        self,
        config: KVStoreConfig,
        payload_bytes: int,
        breaker: CircuitBreaker | None = None,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        self.config = config
        self.payload_bytes = payload_bytes
        self.value_bytes = payload_bytes + 32
        self.max_entries_per_scope = max(1, config.max_bytes // self.value_bytes)
        self.breaker = breaker or CircuitBreaker("kv store", config.breaker_failures, config.breaker_open_s)
        self._connect = connect or self._redis
        self.counters = StoreCounters()
        self.on_ready: Callable[[], None] | None = None  # wakes the engine thread when a fetch ends
        self._fetches: FairQueue[list[bytes]] = FairQueue(
            _MAX_QUEUED_FETCHES, _MAX_QUEUED_FETCHES_PER_TENANT, _MAX_RUNNING_FETCHES_PER_TENANT
        )
        self._writes: FairQueue[tuple[StoreWrite, bytes]] = FairQueue(
            config.max_write_queue, config.max_write_queue
        )
        self._done: deque[FetchResult] = deque()
        self._tickets = itertools.count(1)  # next() is atomic under the GIL; only the engine thread calls it
        self._lock = threading.Lock()  # counters updated from several threads
        self._dirty = True  # counters changed since the last snapshot
        self._snapshot = StoreCounters()
        self._cap_share = 1.0
        self._flushes: list[bytes] = []  # flushes for the write thread (never dropped)
        self._threads = [
            *(
                threading.Thread(target=self._fetch_loop, name=f"weir-kv-store-fetch-{i}", daemon=True)
                for i in range(_FETCH_THREADS)
            ),
            threading.Thread(target=self._write_loop, name="weir-kv-store-write", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def set_scope_share(self, share: float) -> None:
        """A scope's share of `max_bytes` and of the write queue (the server's tenant_cache_share)."""
        self._cap_share = share
        self._writes.max_per_owner = max(1, int(share * self.config.max_write_queue))

    @property
    def fetch_bytes_per_s(self) -> float:
        return self.counters.bytes_per_s

    @property
    def breaker_state(self) -> BreakerState:
        return self.breaker.state

    def snapshot(self) -> StoreCounters:
        """The counters now: a copy made only when they changed since the last (shared: read only)."""
        with self._lock:
            if self._dirty:
                self._snapshot = copy.deepcopy(self.counters)
                self._dirty = False
            return self._snapshot

    @contextmanager
    def _counting(self) -> Iterator[StoreCounters]:
        with self._lock:
            self._dirty = True
            yield self.counters

    @property
    def max_entries_in_scope(self) -> int:
        return max(1, int(self._cap_share * self.max_entries_per_scope))

    def _redis(self) -> Any:
        c = self.config
        return redis.Redis.from_url(
            c.url,
            password=c.password,
            socket_timeout=c.timeout_s,
            socket_connect_timeout=c.timeout_s,
            health_check_interval=0,
        )

    # -- the engine thread's side ------------------------------------------------------------------

    def fetch(self, keys: list[bytes], owner: str = "") -> int | None:
        """Queue the read of a chain of keys for tenant `owner`; its `FetchResult` (this ticket)
        comes back through `poll`. None: refused (the fetch queue is full for `owner`), counted."""
        ticket = next(self._tickets)
        accepted, shed = self._fetches.put(owner, ticket, keys)
        for job in shed:  # another tenant's newest fetch made room for this one: a miss for it
            self._done.append(FetchResult(job.key, (), len(job.item), failed=True))
        with self._counting() as c:
            c.num_fetches_shed += len(shed)
            c.num_fetches_refused += not accepted
        if shed and self.on_ready is not None:
            self.on_ready()
        return ticket if accepted else None

    def cancel(self, ticket: int) -> None:
        """The fetch's request is gone: if it still waits for a thread, it never runs (counted)."""
        if self._fetches.cancel(ticket) is not None:
            with self._counting() as c:
                c.num_fetches_cancelled += 1

    def poll(self) -> list[FetchResult]:
        out: list[FetchResult] = []
        while self._done:
            out.append(self._done.popleft())
        return out

    def write_room(self, scope: str) -> int:
        """How many blocks of `scope` `write` would take now (0: breaker open or no room)."""
        if self.breaker.state is BreakerState.OPEN:
            return 0
        return self._writes.room(scope)

    def write(self, tag: StoreWrite, payload: bytes) -> bool:
        """Queue a block's write; False (dropped, counted) when its scope's share of the queue is
        full, or the queue is and its scope's backlog is the longest, or the breaker is open."""
        if self.breaker.state is BreakerState.OPEN:
            self.count_dropped(tag.scope)
            return False
        accepted, shed = self._writes.put(tag.scope, 0, (tag, payload))
        for job in shed:
            self.count_dropped(job.owner)
        if not accepted:
            self.count_dropped(tag.scope)
        return accepted

    def count_dropped(self, scope: str, n: int = 1) -> None:
        """`n` blocks of `scope` not written (dropped before their bytes were even read, or here)."""
        with self._counting() as c:
            c.num_dropped_writes += n
            c.dropped_writes_by_scope[scope] = c.dropped_writes_by_scope.get(scope, 0) + n

    def flush(self, pattern: bytes) -> None:
        """Queue the removal of every entry of the indexes matching `pattern`; never dropped, never
        blocking (the write thread runs it with its next batch)."""
        with self._lock:
            self._flushes.append(pattern)
        self._writes.kick()

    def close(self) -> None:
        """Stop the threads: queued fetches are dropped, queued writes and flushes go out first.
        Waits for the write thread at most a few store calls' timeouts (call it off the event loop)."""
        self._fetches.close(discard=True)
        self._writes.close(discard=False)
        self._threads[-1].join(timeout=4 * self.config.timeout_s)

    # -- the fetch threads ---------------------------------------------------------------------------

    def _fetch_loop(self) -> None:
        conn: Any = None
        while True:
            jobs = self._fetches.take()
            if jobs is None:
                return
            job = jobs[0]
            try:
                result = FetchResult(job.key, (), len(job.item), failed=True)
                if self.breaker.allow():
                    try:
                        if conn is None:
                            conn = self._connect()
                        result = self._read_chain(conn, job.key, job.item)
                        self.breaker.record_success()
                    except Exception as exc:  # any store fault is a miss; the request recomputes
                        conn = None
                        with self._counting() as c:
                            c.num_fetch_errors += 1
                        self.breaker.record_failure(f"fetch: {type(exc).__name__}: {exc}")
            finally:
                self._fetches.done(job.owner)
            self._done.append(result)
            if self.on_ready is not None:
                self.on_ready()

    def _read_chain(self, conn: Any, ticket: int, keys: list[bytes]) -> FetchResult:
        t0 = time.monotonic()
        pipe = conn.pipeline(transaction=False)
        for i in range(0, len(keys), _FETCH_CHUNK):
            pipe.mget(keys[i : i + _FETCH_CHUNK])
        values = [v for chunk in pipe.execute() for v in chunk]
        elapsed = time.monotonic() - t0
        payloads: list[bytes] = []
        bad_mac = bad_length = 0
        for key, value in zip(keys, values, strict=True):
            if value is None:
                break
            got = unseal(self.config.secret, key, value, self.payload_bytes)
            if isinstance(got, UnsealError):  # altered, foreign or garbage: it and all after it recompute
                bad_mac += got is UnsealError.BAD_MAC
                bad_length += got is UnsealError.WRONG_LENGTH
                break
            payloads.append(got)
        size = sum(len(v) for v in values if v is not None)
        with self._counting() as c:
            c.num_fetches += 1
            c.num_hit_blocks += len(payloads)
            c.num_miss_blocks += len(keys) - len(payloads)
            c.num_bad_mac += bad_mac
            c.num_bad_length += bad_length
            c.bytes_read += size
            c.fetch_latency_sum_s += elapsed
            for i, bound in enumerate(FETCH_LATENCY_BUCKETS_S):
                if elapsed <= bound:
                    c.fetch_latency_buckets[i] += 1
                    break
            if size and elapsed > 0:
                rate = size / elapsed
                c.bytes_per_s = rate if c.bytes_per_s == 0 else 0.8 * c.bytes_per_s + 0.2 * rate
        return FetchResult(ticket, tuple(payloads), len(keys), failed=False)

    # -- the write thread ----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        conn: Any = None
        while True:
            jobs = self._writes.take(_WRITE_BATCH)
            with self._lock:
                flushes, self._flushes = self._flushes, []
            if jobs is None:
                self._last_flushes(conn, flushes)
                return
            if flushes:  # every write queued before a flush goes out before it
                jobs.extend(self._writes.take(self._writes.max_items, timeout=0) or ())
            writes = [job.item for job in jobs]
            try:
                if conn is None:
                    conn = self._connect()
                if writes:
                    if self.breaker.allow():
                        self._write_batch(conn, writes)
                        self.breaker.record_success()
                    else:
                        for tag, _ in writes:
                            self.count_dropped(tag.scope)
                for pattern in flushes:
                    self._flush(conn, pattern)
            except Exception as exc:
                conn = None
                with self._counting() as c:
                    c.num_write_errors += len(writes)
                self.breaker.record_failure(f"write: {type(exc).__name__}: {exc}")
                if flushes:
                    logger.error("kv store flush of %s failed: %s", flushes, exc)

    def _last_flushes(self, conn: Any, flushes: list[bytes]) -> None:
        """Closing: flushes still queued (a retired version's) run before the thread ends."""
        for pattern in flushes:
            try:
                conn = conn if conn is not None else self._connect()
                self._flush(conn, pattern)
            except Exception as exc:
                logger.error("kv store flush of %s failed: %s", pattern, exc)

    def _write_batch(self, conn: Any, writes: list[tuple[StoreWrite, bytes]]) -> None:
        by_index: dict[bytes, list[tuple[StoreWrite, bytes]]] = {}
        for tag, payload in writes:
            by_index.setdefault(tag.index_key, []).append((tag, payload))
        secret, ttl = self.config.secret, self.config.ttl_s
        now_ms = int(time.time() * 1000)
        script = conn.register_script(_WRITE_SCRIPT)
        for index, items in by_index.items():
            args: list[Any] = [ttl, self.max_entries_in_scope, now_ms]
            for tag, payload in items:
                args.extend((tag.key, seal(secret, tag.key, payload)))
            evicted, entries = script(keys=[index], args=args)
            with self._counting() as c:
                c.num_written_blocks += len(items)
                c.bytes_written += len(items) * self.value_bytes
                c.num_evicted += int(evicted)
                scope = items[0][0].scope
                c.scope_entries[scope] = int(entries)
                c.written_blocks_by_scope[scope] = c.written_blocks_by_scope.get(scope, 0) + len(items)

    def _flush(self, conn: Any, pattern: bytes) -> None:
        removed = 0
        for index in conn.scan_iter(match=pattern, count=100):
            keys = conn.zrange(index, 0, -1)
            for i in range(0, len(keys), 256):
                removed += int(conn.delete(*keys[i : i + 256]))
            conn.delete(index)
        with self._counting() as c:
            c.num_flushed += removed
        logger.info("kv store: flushed %d entries of %s", removed, pattern.decode(errors="replace"))
