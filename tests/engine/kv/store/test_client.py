"""The store's I/O threads against a real redis-server (tests/redis_server.py): sealed writes and
pipelined chain reads, MAC refusals, per-scope caps that evict the scope's own oldest entries,
TTLs, flushes, a bounded write queue that drops, and a paused or password-changed store; and,
over a connection that blocks (a slow store), the fair fetch and write queues between tenants."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tests.gateway.harness import wait_until
from tests.redis_server import RedisServer
from weir.engine.config import KVStoreConfig
from weir.engine.kv.store.client import KVStoreClient
from weir.engine.kv.store.codec import FetchResult, StoreWrite, block_key, index_key, index_pattern
from weir.engine.kv.store.stats import BreakerState

SECRET = b"s" * 32
PAYLOAD = 64


def _client(server: RedisServer, **kw) -> KVStoreClient:  # type: ignore[no-untyped-def]
    config = KVStoreConfig(url=server.url, secret=SECRET, **kw)
    return KVStoreClient(config, PAYLOAD)


def _tag(i: int, scope: str = "a", version: str = "v1") -> StoreWrite:
    return StoreWrite(block_key("weir", bytes([i]) * 32), index_key("weir", version, scope), scope)


def _fetch(client: KVStoreClient, keys: list[bytes]) -> FetchResult:
    ticket = client.fetch(keys)
    got: list[FetchResult] = []
    assert wait_until(lambda: bool(got.extend(client.poll()) or got), 10)
    assert got[0].ticket == ticket
    return got[0]


def _written(client: KVStoreClient, n: int) -> bool:
    return wait_until(lambda: client.snapshot().num_written_blocks >= n, 10)


def test_blocks_written_come_back_along_the_chain_until_the_first_miss(redis_server: RedisServer) -> None:
    c = _client(redis_server)
    try:
        for i in (1, 2, 4):
            assert c.write(_tag(i), bytes([i]) * PAYLOAD)
        assert _written(c, 3)
        keys = [_tag(i).key for i in (1, 2, 3, 4)]
        got = _fetch(c, keys)
        assert not got.failed and got.payloads == (b"\x01" * PAYLOAD, b"\x02" * PAYLOAD)
        s = c.snapshot()
        assert s.num_hit_blocks == 2 and s.num_miss_blocks == 2 and s.bytes_read == 3 * c.value_bytes
        assert s.bytes_written == 3 * c.value_bytes and s.bytes_per_s > 0
        assert 0 < redis_server.client().ttl(_tag(1).key) <= 3600  # every key expires
    finally:
        c.close()


def test_a_tampered_or_foreign_value_is_refused_and_ends_the_chain(redis_server: RedisServer) -> None:
    c = _client(redis_server)
    try:
        for i in (1, 2, 3):
            c.write(_tag(i), bytes([i]) * PAYLOAD)
        assert _written(c, 3)
        r = redis_server.client()
        value = bytearray(r.get(_tag(2).key))
        value[5] ^= 0xFF
        r.set(_tag(2).key, bytes(value))
        got = _fetch(c, [_tag(i).key for i in (1, 2, 3)])
        assert got.payloads == (b"\x01" * PAYLOAD,)
        r.set(_tag(1).key, b"garbage")
        assert _fetch(c, [_tag(1).key]).payloads == ()
        s = c.snapshot()
        assert s.num_bad_mac == 1 and s.num_bad_length == 1
    finally:
        c.close()


def test_a_scope_at_its_cap_evicts_its_own_oldest_entries_only(redis_server: RedisServer) -> None:
    c = _client(redis_server, max_bytes=4 * (PAYLOAD + 32))  # 4 entries per scope
    try:
        c.write(_tag(100, scope="b"), b"b" * PAYLOAD)
        assert _written(c, 1)
        for i in range(1, 11):  # tenant a floods unique blocks
            c.write(_tag(i, scope="a"), bytes([i]) * PAYLOAD)
            time.sleep(0.002)  # distinct write times, so "oldest" is well defined
        assert _written(c, 11)
        r = redis_server.client()
        assert r.zcard(index_key("weir", "v1", "a")) == 4
        assert [i for i in range(1, 11) if r.exists(_tag(i).key)] == [7, 8, 9, 10]
        assert r.exists(_tag(100, scope="b").key)  # the other tenant keeps its entry
        assert c.snapshot().num_evicted == 6 and c.snapshot().scope_entries["a"] == 4
    finally:
        c.close()


def test_flushes_remove_a_scopes_or_a_versions_entries(redis_server: RedisServer) -> None:
    c = _client(redis_server)
    try:
        c.write(_tag(1, "a", "v1"), b"1" * PAYLOAD)
        c.write(_tag(2, "b", "v1"), b"2" * PAYLOAD)
        c.write(_tag(3, "a", "v2"), b"3" * PAYLOAD)
        assert _written(c, 3)
        r = redis_server.client()
        c.flush(index_pattern("weir", "v1", "a"))
        assert wait_until(lambda: not r.exists(_tag(1).key), 10)
        assert r.exists(_tag(2).key) and r.exists(_tag(3).key)
        c.flush(index_pattern("weir", "v2", None))  # a version retired
        assert wait_until(lambda: not r.exists(_tag(3).key), 10)
        assert r.exists(_tag(2).key) and c.snapshot().num_flushed == 2
    finally:
        c.close()


def test_a_paused_store_opens_the_breaker_and_writes_are_dropped_not_queued(
    redis_server: RedisServer,
) -> None:
    c = _client(redis_server, timeout_s=0.2, max_write_queue=4, breaker_failures=1, breaker_open_s=60)
    try:
        c.write(_tag(1), b"1" * PAYLOAD)
        assert _written(c, 1)
        redis_server.pause()  # SIGSTOP: connections hang, nothing answers
        t0 = time.monotonic()
        got = _fetch(c, [_tag(1).key])
        assert got.failed and got.payloads == ()
        assert time.monotonic() - t0 < 5  # bounded by the socket timeout, not by the store
        assert c.breaker.state is BreakerState.OPEN
        accepted = sum(c.write(_tag(i), b"x" * PAYLOAD) for i in range(2, 40))
        assert accepted == 0 and c.snapshot().num_dropped_writes >= 38
        assert _fetch(c, [_tag(1).key]).failed  # open: not even asked
    finally:
        redis_server.resume()
        c.close()


def test_a_changed_password_turns_fetches_into_misses(redis_server: RedisServer) -> None:
    c = _client(redis_server, breaker_failures=1, breaker_open_s=0.1)
    try:
        c.write(_tag(1), b"1" * PAYLOAD)
        assert _written(c, 1)
        redis_server.client().config_set("requirepass", "rotated")
        redis_server.client(password="rotated").client_kill_filter(_type="normal", skipme=True)
        got = _fetch(c, [_tag(1).key])
        assert got.failed and c.snapshot().num_fetch_errors >= 1
    finally:
        c.close()


class _BlockingConn:
    """A store connection whose calls wait for `release` (a slow store), recording the keys read."""

    def __init__(self, release: threading.Event, slow: bytes) -> None:
        self.release, self.slow = release, slow
        self.keys: list[bytes] = []

    def pipeline(self, transaction: bool = False) -> _BlockingConn:
        self.keys = []
        return self

    def mget(self, keys: list[bytes]) -> None:
        self.keys.extend(keys)

    def execute(self) -> list[list[None]]:
        if self.keys[0].startswith(self.slow):
            self.release.wait()
        return [[None] * len(self.keys)]

    def register_script(self, script: str) -> Callable[..., list[int]]:
        self.release.wait()
        return lambda keys, args: [0, 1]


def _fake_client(release: threading.Event, slow: bytes = b"slow", **kw) -> KVStoreClient:  # type: ignore[no-untyped-def]
    config = KVStoreConfig(url="redis://127.0.0.1:1/0", secret=SECRET, **kw)
    return KVStoreClient(config, PAYLOAD, connect=lambda: _BlockingConn(release, slow))


def test_a_tenant_flooding_fetches_leaves_a_thread_for_another_and_its_ended_fetches_are_cancelled() -> None:
    release = threading.Event()
    c = _fake_client(release)
    try:
        tickets = [c.fetch([b"slow%d" % i], owner="flooder") for i in range(6)]
        assert all(t is not None for t in tickets)
        assert wait_until(lambda: c._fetches.running("flooder") == 2, 10)  # of three threads
        got = _fetch_as(c, [b"fast"], "victim")  # answered while every flood fetch is stuck
        assert got.payloads == () and not got.failed
        for t in tickets[2:]:  # their requests ended: never run
            assert t is not None
            c.cancel(t)
        assert c._fetches.queued() == 0 and c.snapshot().num_fetches_cancelled == 4
        refused = [c.fetch([b"slow"], owner="flooder") for _ in range(20)]
        assert refused.count(None) == 20 - 8 and c.snapshot().num_fetches_refused == 12  # its queue share
        assert c.fetch([b"fast"], owner="victim") is not None  # another tenant still gets in
    finally:
        release.set()
        c.close()


def test_a_scope_flooding_writes_fills_only_its_share_of_the_queue() -> None:
    release = threading.Event()
    c = _fake_client(release, max_write_queue=8)
    c.set_scope_share(0.5)  # 4 queued blocks per scope
    try:
        assert c.write(_tag(0, scope="a"), b"0" * PAYLOAD)
        assert wait_until(lambda: c._writes.queued() == 0, 10)  # the write thread holds it, stuck
        accepted = [c.write(_tag(i, scope="a"), b"a" * PAYLOAD) for i in range(1, 11)]
        assert accepted.count(True) == 4 and c.write_room("a") == 0
        assert c.write_room("b") == 4
        assert all(c.write(_tag(i, scope="b"), b"b" * PAYLOAD) for i in range(20, 24))
        s = c.snapshot()
        assert s.dropped_writes_by_scope == {"a": 6} and s.num_dropped_writes == 6
    finally:
        release.set()
        c.close()


def _fetch_as(client: KVStoreClient, keys: list[bytes], owner: str) -> FetchResult:
    ticket = client.fetch(keys, owner)
    assert ticket is not None
    got: list[FetchResult] = []
    assert wait_until(lambda: bool(got.extend(r for r in client.poll() if r.ticket == ticket) or got), 10)
    return got[0]
