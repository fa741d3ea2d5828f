"""The shared KV store tier, the engine thread's side: what to fetch, what landed, what to write.

Below the device pool and the host tier (`weir.engine.kv.host_kv_tier`), one chain of block
hashes continues into a Redis/Valkey store shared by every replica (`weir.engine.kv.store.client`
does the I/O on its own threads). Plain Python, no torch; the tensor side is
`weir.engine.kv.store.tensors`.

- **Fetch.** A request whose prefix misses the device and the host from block `i` on may find
  blocks `i..` in the store. `try_fetch` decides whether to ask: only where the estimated read
  (the blocks' bytes at the fetch bandwidth measured so far) beats their recompute (the
  engine's prefill cost for those tokens), while the breaker lets calls through, the bytes
  held for waiting requests stay under `max_fetch_bytes` and those of its tenant under the
  tenant's share of it, and the I/O's fetch queue has room for its tenant (it is fair per
  tenant: `weir.engine.kv.store.fair_queue`). Each request's decision counts once per outcome
  (`FetchDecisions`), not once per step it is looked at. The request then waits in its own
  state (the scheduler's FETCHING_KV) while other requests step. Its fetch ends when the I/O
  thread answers or at its deadline, whichever is first: the deadline is the estimated recompute
  time (the configured timeout before a prefill cost is known), so no request waits for the
  store longer than its prefill would take. An answer after the deadline is ignored; a fetch
  past its deadline, or whose request ended, is cancelled if it still waits for a thread.
- **Land.** The verified payloads of the chain's leading blocks are kept by request (`landed`)
  until the KV cache manager copies them into device blocks at admission (`forget` then).
- **Write behind.** A block is planned for writing when a request registers it in the prefix
  cache (so other replicas find a prompt's blocks while it still decodes), and a finished
  request's cached blocks are planned again (`plan_write` skips hashes written or fetched within
  half the TTL). The plan is taken with the step's transfers: the runner reads the bytes before
  anything of the step writes a block and hands them to the write queue. Blocks the queue has
  no room for (its scope's share is full, or the breaker is open) are dropped before their
  bytes are copied out, counted per scope.
- **Flush.** An admin flush of scopes, or of the whole version, queues the removal of their
  store indexes' entries (`weir.engine.kv.store.codec` names them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from weir.engine.kv.store.codec import FetchResult, StoreWrite, block_key, index_key, index_pattern
from weir.engine.kv.store.stats import BreakerState, FetchDecisions, KVStoreStats, StoreCounters

# Hashes remembered as written or fetched (so they are not written again soon).
_MAX_REMEMBERED = 1 << 16


class StoreIO(Protocol):
    """What the tier needs of the store's I/O (`KVStoreClient`)."""

    value_bytes: int
    on_ready: Callable[[], None] | None  # called on an I/O thread when a fetch ends

    @property
    def max_entries_in_scope(self) -> int: ...  # the cap each scope is held to (its share applied)

    def close(self) -> None: ...

    def fetch(self, keys: list[bytes], owner: str) -> int | None: ...  # its ticket (unique for the

    # process); None: refused (the fetch queue is full for tenant `owner`)

    def cancel(self, ticket: int) -> None: ...  # its request is gone: never run it if still queued

    def poll(self) -> list[FetchResult]: ...

    def write_room(self, scope: str) -> int: ...  # blocks of `scope` a write would take now

    def count_dropped(self, scope: str, n: int) -> None: ...  # blocks not written, never copied out

    def flush(self, pattern: bytes) -> None: ...

    @property
    def fetch_bytes_per_s(self) -> float: ...

    @property
    def breaker_state(self) -> BreakerState: ...

    def snapshot(self) -> StoreCounters: ...


@dataclass
class _Fetch:
    request_id: str
    owner: str  # the tenant
    hashes: list[bytes]
    deadline_s: float
    num_bytes: int


class KVStoreTier:
    """Fetch decisions, landed payloads and planned writes of one engine (one model version)."""

    def __init__(
        self,
        io: StoreIO,
        namespace: str,
        model_version: str,
        block_size: int,
        prefill_seconds: Callable[[int], float],
        timeout_s: float,
        max_fetch_bytes: int,
        ttl_s: float,
        clock: Callable[[], float],
        decisions: FetchDecisions | None = None,
        tenant_share: float = 1.0,
    ) -> None:
        self.io = io
        self.namespace = namespace
        self.model_version = model_version
        self.block_size = block_size
        self.prefill_seconds = prefill_seconds  # tokens -> estimated seconds; 0: not known yet
        self.timeout_s = timeout_s
        self.max_fetch_bytes = max_fetch_bytes
        # What one tenant's waiting requests may hold of it (the server's tenant_cache_share).
        self.max_fetch_bytes_per_tenant = max(1, int(max_fetch_bytes * tenant_share))
        self.rewrite_after_s = ttl_s / 2
        self.clock = clock
        self.decisions = decisions if decisions is not None else FetchDecisions()
        self._fetches: dict[int, _Fetch] = {}  # ticket -> fetch in flight
        self._ticket_of: dict[str, int] = {}
        self._landed: dict[str, dict[bytes, bytes]] = {}  # request id -> hash -> payload
        self._held_bytes = 0  # in flight and landed
        self._tried: set[str] = set()  # requests that asked once (never twice)
        self._remembered: OrderedDict[bytes, float] = OrderedDict()  # hash -> when written / fetched
        self._saves: list[tuple[int, StoreWrite]] = []
        self._ended: list[str] = []
        self._owner_of: dict[str, str] = {}  # request id -> its tenant, while it holds bytes
        self._held_by_owner: dict[str, int] = {}  # tenant -> bytes in flight and landed for it
        self._decided: dict[str, str] = {}  # request id -> the last decision counted for it

    # -- fetch ------------------------------------------------------------------------------------

    def try_fetch(self, request_id: str, hashes: list[bytes], owner: str = "") -> bool:
        """Ask the store for `hashes` (a chain continuing a prefix hit) for tenant `owner`'s
        request if that beats recompute. Each decision is counted once per request."""
        if not hashes or request_id in self._tried:
            return False
        if self.io.breaker_state is BreakerState.OPEN:
            return self._decide(request_id, "num_breaker_open")
        num_bytes = len(hashes) * self.io.value_bytes
        if self._held_bytes + num_bytes > self.max_fetch_bytes:
            return self._decide(request_id, "num_over_bytes")
        if self._held_by_owner.get(owner, 0) + num_bytes > self.max_fetch_bytes_per_tenant:
            return self._decide(request_id, "num_tenant_over_bytes")
        num_tokens = len(hashes) * self.block_size
        recompute_s = self.prefill_seconds(num_tokens)
        bandwidth = self.io.fetch_bytes_per_s
        if recompute_s > 0 and bandwidth > 0 and num_bytes / bandwidth >= recompute_s:
            return self._decide(request_id, "num_recompute_cheaper")
        # The I/O numbers tickets, not this tier: one rebuilt by an engine reset never takes a
        # late answer to its predecessor's fetch for one of its own.
        ticket = self.io.fetch([block_key(self.namespace, h) for h in hashes], owner)
        if ticket is None:
            return self._decide(request_id, "num_queue_full")
        self._tried.add(request_id)
        self._decide(request_id, "num_fetched")
        d = self.decisions
        d.last_fetch_bytes_per_s = bandwidth
        d.last_recompute_tokens_per_s = num_tokens / recompute_s if recompute_s > 0 else 0.0
        wait_s = recompute_s if recompute_s > 0 else self.timeout_s
        self._fetches[ticket] = _Fetch(request_id, owner, hashes, self.clock() + wait_s, num_bytes)
        self._ticket_of[request_id] = ticket
        self._hold(request_id, owner, num_bytes)
        return True

    def _decide(self, request_id: str, counter: str) -> bool:
        """Count `counter` for the request unless it was its last decision already; False."""
        if self._decided.get(request_id) != counter:
            self._decided[request_id] = counter
            setattr(self.decisions, counter, getattr(self.decisions, counter) + 1)
        return False

    def _hold(self, request_id: str, owner: str, num_bytes: int) -> None:
        """Account `num_bytes` (negative: released) held for the request of tenant `owner`."""
        self._held_bytes += num_bytes
        left = self._held_by_owner.pop(owner, 0) + num_bytes
        if left:
            self._held_by_owner[owner] = left
        self._owner_of[request_id] = owner

    def _end_fetch(self, ticket: int) -> _Fetch:
        f = self._fetches.pop(ticket)
        del self._ticket_of[f.request_id]
        self._hold(f.request_id, f.owner, -f.num_bytes)
        return f

    def poll(self) -> list[str]:
        """Requests whose fetch ended since the last call (answered, failed or past its deadline)."""
        for result in self.io.poll():
            if result.ticket not in self._fetches:
                continue  # its request gave up (deadline) or ended meanwhile
            f = self._end_fetch(result.ticket)
            if result.payloads:
                landed = dict(zip(f.hashes, result.payloads, strict=False))
                self._landed[f.request_id] = landed
                self._hold(f.request_id, f.owner, len(landed) * self.io.value_bytes)
                now = self.clock()
                for h in landed:
                    self._remember(h, now)
            self._ended.append(f.request_id)
        now = self.clock()
        for ticket, f in list(self._fetches.items()):
            if f.deadline_s <= now:
                self._end_fetch(ticket)
                self.io.cancel(ticket)  # still queued behind others: never run it
                self.decisions.num_timeouts += 1
                self._ended.append(f.request_id)
        ended, self._ended = self._ended, []
        return ended

    def next_deadline_s(self) -> float | None:
        return min((f.deadline_s for f in self._fetches.values()), default=None)

    def landed(self, request_id: str) -> dict[bytes, bytes]:
        """The payloads fetched for a request, by block hash (empty: none)."""
        return self._landed.get(request_id, {})

    def on_landed(self, num_blocks: int) -> None:
        self.decisions.num_landed_blocks += num_blocks

    def forget(self, request_id: str) -> None:
        """The request was admitted or ended: drop what it holds; a fetch still queued for it is
        cancelled (one under way is ignored when it answers)."""
        landed = self._landed.pop(request_id, None)
        owner = self._owner_of.pop(request_id, "")
        if landed:
            self._hold(request_id, owner, -len(landed) * self.io.value_bytes)
        ticket = self._ticket_of.get(request_id)
        if ticket is not None:
            self._end_fetch(ticket)
            self.io.cancel(ticket)
        self._owner_of.pop(request_id, None)

    def end(self, request_id: str) -> None:
        """The request is gone: forget it, and that it asked (its id may come back)."""
        self.forget(request_id)
        self._tried.discard(request_id)
        self._decided.pop(request_id, None)

    # -- write behind -----------------------------------------------------------------------------

    def plan_write(self, block_id: int, block_hash: bytes, scope: str) -> None:
        """Write a cached device block's bytes to the store with the next step (unless written
        lately; an open breaker drops it at once, counted, and leaves it to be written later)."""
        if self.io.breaker_state is BreakerState.OPEN:
            self.io.count_dropped(scope, 1)
            return
        now = self.clock()
        seen = self._remembered.get(block_hash)
        if seen is not None and now - seen < self.rewrite_after_s:
            return
        self._remember(block_hash, now)
        tag = StoreWrite(
            block_key(self.namespace, block_hash), index_key(self.namespace, self.model_version, scope), scope
        )
        self._saves.append((block_id, tag))

    @property
    def has_saves(self) -> bool:
        return bool(self._saves)

    def take_saves(self) -> tuple[tuple[int, StoreWrite], ...]:
        """The planned writes the write queue has room for now, per scope (so no block's bytes
        are copied out only to be dropped); the others are dropped here, counted."""
        saves, self._saves = self._saves, []
        if not saves:
            return ()
        room: dict[str, int] = {}
        dropped: dict[str, int] = {}
        kept: list[tuple[int, StoreWrite]] = []
        for block_id, tag in saves:
            left = room.get(tag.scope)
            if left is None:
                left = self.io.write_room(tag.scope)
            if left > 0:
                kept.append((block_id, tag))
            else:
                dropped[tag.scope] = dropped.get(tag.scope, 0) + 1
            room[tag.scope] = left - 1
        for scope, n in dropped.items():
            self.io.count_dropped(scope, n)
        return tuple(kept)

    def _remember(self, block_hash: bytes, now: float) -> None:
        self._remembered[block_hash] = now
        self._remembered.move_to_end(block_hash)
        if len(self._remembered) > _MAX_REMEMBERED:
            self._remembered.popitem(last=False)

    # -- admin --------------------------------------------------------------------------------------

    def flush(self, scopes: set[str] | None, model_version: str | None = "") -> None:
        """Queue the removal of `scopes`' entries (None: every scope) of this engine's version
        (`model_version` None: of every version)."""
        version = self.model_version if model_version == "" else model_version
        self._remembered.clear()
        if scopes is None:
            self.io.flush(index_pattern(self.namespace, version, None))
            return
        for scope in scopes:
            self.io.flush(index_pattern(self.namespace, version, scope))

    def stats(self) -> KVStoreStats:
        return KVStoreStats(
            decisions=replace(self.decisions),
            io=self.io.snapshot(),
            num_fetching=len(self._fetches),
            breaker_state=self.io.breaker_state,
            value_bytes=self.io.value_bytes,
            max_entries_per_scope=self.io.max_entries_in_scope,
        )
