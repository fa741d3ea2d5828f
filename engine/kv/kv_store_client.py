"""The shared KV store's I/O: two threads over a Redis/Valkey connection, off the engine step.

- The **fetch threads** (two, each with its own connection, so one slow fetch does not hold
  every other) take one fetch at a time each: a request's chain of block keys, read with one
  pipelined round of MGETs. Each value is unsealed (`weir.engine.kv.kv_store_codec`: a wrong
  length or a bad MAC is counted and ends the chain: nothing after it is trusted), and the
  verified payloads are queued for the engine thread (`poll`), which is woken (`on_ready`).
- The **write thread** drains a bounded queue of blocks to write. `write` never blocks: a full
  queue drops the block (counted), so a slow store can never hold the engine or grow memory.
  Each batch is sealed and written per scope index by one Lua script: SET with a TTL, the key
  added to the scope's index, entries past the TTL forgotten, and the scope's oldest entries
  evicted past its cap. Flushes (admin, version retirement) run on this thread too, in order.

Both threads ask the circuit breaker before a call and report its outcome; an open breaker
turns fetches into misses and drops writes. Every call has a socket timeout, so a stalled
(SIGSTOPped) store costs at most that. No torch here.
"""

from __future__ import annotations

import copy
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from weir.engine.config import KVStoreConfig
from weir.engine.kv.circuit_breaker import CircuitBreaker
from weir.engine.kv.kv_store_codec import FetchResult, StoreWrite, UnsealError, seal, unseal
from weir.engine.kv.kv_store_stats import FETCH_LATENCY_BUCKETS_S, BreakerState, StoreCounters

logger = logging.getLogger("weir.engine")

# Fetches read at once (each thread its own connection): one slow fetch does not hold the others.
_FETCH_THREADS = 2
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
        self._fetches: queue.Queue[tuple[int, list[bytes]] | None] = queue.Queue()
        self._writes: queue.Queue[tuple[StoreWrite, bytes] | tuple[bytes, int] | None] = queue.Queue(
            maxsize=config.max_write_queue
        )
        self._done: deque[FetchResult] = deque()
        self._tickets = itertools.count(1)  # next() is atomic under the GIL; only the engine thread calls it
        self._lock = threading.Lock()  # counters updated from two threads
        self._cap_share = 1.0
        self._pending_flushes: list[bytes] = []  # flushes that found the write queue full
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
        """A scope's share of `max_bytes` (the server's tenant_cache_share)."""
        self._cap_share = share

    @property
    def fetch_bytes_per_s(self) -> float:
        return self.counters.bytes_per_s

    @property
    def breaker_state(self) -> BreakerState:
        return self.breaker.state

    def snapshot(self) -> StoreCounters:
        with self._lock:
            return copy.deepcopy(self.counters)

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

    def fetch(self, keys: list[bytes]) -> int:
        """Queue the read of a chain of keys; its `FetchResult` (this ticket) comes back through `poll`."""
        ticket = next(self._tickets)
        self._fetches.put((ticket, keys))
        return ticket

    def poll(self) -> list[FetchResult]:
        out: list[FetchResult] = []
        while self._done:
            out.append(self._done.popleft())
        return out

    def write(self, tag: StoreWrite, payload: bytes) -> bool:
        """Queue a block's write; False (dropped, counted) when the queue is full or the breaker open."""
        if self.breaker.state is BreakerState.OPEN:
            self._count_drop()
            return False
        try:
            self._writes.put_nowait((tag, payload))
        except queue.Full:
            self._count_drop()
            return False
        return True

    def flush(self, pattern: bytes) -> None:
        """Queue the removal of every entry of the indexes matching `pattern`; never dropped, never
        blocking (a full queue carries it with the next batch)."""
        try:
            self._writes.put_nowait((pattern, 0))
        except queue.Full:
            with self._lock:
                self._pending_flushes.append(pattern)

    def close(self) -> None:
        for _ in range(_FETCH_THREADS):
            self._fetches.put(None)
        try:
            self._writes.put(None, timeout=self.config.timeout_s)
        except queue.Full:
            pass

    def _count_drop(self) -> None:
        with self._lock:
            self.counters.num_dropped_writes += 1

    # -- the fetch threads ---------------------------------------------------------------------------

    def _fetch_loop(self) -> None:
        conn: Any = None
        while True:
            job = self._fetches.get()
            if job is None:
                return
            ticket, keys = job
            result = FetchResult(ticket, (), len(keys), failed=True)
            if self.breaker.allow():
                try:
                    if conn is None:
                        conn = self._connect()
                    result = self._read_chain(conn, ticket, keys)
                    self.breaker.record_success()
                except Exception as exc:  # any store fault is a miss; the request recomputes
                    conn = None
                    with self._lock:
                        self.counters.num_fetch_errors += 1
                    self.breaker.record_failure(f"fetch: {type(exc).__name__}: {exc}")
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
        with self._lock:
            c = self.counters
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
            first = self._writes.get()
            if first is None:
                self._last_flushes(conn)
                return
            batch = [first]
            while len(batch) < _WRITE_BATCH:
                try:
                    item = self._writes.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._writes.put_nowait(None)  # seen after this batch
                    break
                batch.append(item)
            writes = [(t, p) for t, p in batch if isinstance(t, StoreWrite)]
            flushes = [t for t, _ in batch if isinstance(t, bytes)]
            with self._lock:
                flushes.extend(self._pending_flushes)
                self._pending_flushes.clear()
            try:
                if conn is None:
                    conn = self._connect()
                if writes:
                    if self.breaker.allow():
                        self._write_batch(conn, writes)  # type: ignore[arg-type]
                        self.breaker.record_success()
                    else:
                        with self._lock:
                            self.counters.num_dropped_writes += len(writes)
                for pattern in flushes:
                    self._flush(conn, pattern)
            except Exception as exc:
                conn = None
                with self._lock:
                    self.counters.num_write_errors += len(writes)
                self.breaker.record_failure(f"write: {type(exc).__name__}: {exc}")
                if flushes:
                    logger.error("kv store flush of %s failed: %s", flushes, exc)

    def _last_flushes(self, conn: Any) -> None:
        """Closing: flushes still queued (a retired version's) run before the thread ends."""
        with self._lock:
            flushes, self._pending_flushes = self._pending_flushes, []
        for pattern in flushes:
            try:
                self._flush(conn if conn is not None else self._connect(), pattern)
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
            with self._lock:
                c = self.counters
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
        with self._lock:
            self.counters.num_flushed += removed
        logger.info("kv store: flushed %d entries of %s", removed, pattern.decode(errors="replace"))
