"""What the KV cache manager's state machines share (tests/engine/kv/test_kv_cache_manager.py and
tests/engine/kv/test_host_kv_tier.py): request ids, the model of what each cached hash holds, the
fork and shared-prefix rules, and the ref-count check of one block pool."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from weir.engine.kv.block_pool import Block, BlockPool
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Request, SamplingParams

BS = 2
SCOPES = ("a", "b")


def make_request(rid: str, prompt: list[int], scope: str = "a") -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=64), tenant_id=scope, cache_scope=scope)


def assert_ref_counts(pool: BlockPool, holders: Iterable[Block]) -> None:
    """Each block's ref count is how often `holders` (every reference held, one entry each) lists
    it, and exactly the unreferenced, unpinned blocks are free."""
    refs = Counter(b.block_id for b in holders)
    for block in pool.blocks[1:]:
        assert block.ref_cnt == refs.get(block.block_id, 0)
        assert pool.free_queue.contains(block) == (block.ref_cnt == 0 and not block.pinned)


class KVMachineBase(RuleBasedStateMachine):
    """A subclass sets `kv`, `live` (running requests by id), `expected` (cached hash -> the tokens
    of its block) and `next_id` in its __init__."""

    kv: KVCacheManager
    live: dict[str, Request]
    expected: dict[bytes, list[int]]
    next_id: int

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    def _pick(self, data: st.DataObject, group: dict[str, Request]) -> Request:
        return group[data.draw(st.sampled_from(sorted(group)))]

    def _record_cached(self, req: Request) -> None:
        for i, block in enumerate(self.kv.blocks(req.request_id)):
            h = block.block_hash
            if h is not None and h not in self.expected and (i + 1) * BS <= req.num_computed_tokens:
                self.expected[h] = [req.token_at(p) for p in range(i * BS, (i + 1) * BS)]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=st.lists(st.integers(1, 3), max_size=3))
    def fork(self, data: st.DataObject, extra: list[int]) -> None:
        parent = self._pick(data, self.live)
        if parent.num_computed_tokens == 0:
            return
        cut = data.draw(st.integers(1, parent.num_computed_tokens))
        prefix = parent.all_token_ids[:cut]
        child = make_request(self._new_id(), prefix + extra, parent.cache_scope)
        child.num_computed_tokens = min(cut, child.num_tokens)
        if child.num_computed_tokens == child.num_tokens:
            child.num_computed_tokens -= 1  # a fork always has a token left to feed
            if child.num_computed_tokens == 0:
                return
        self.kv.fork(parent, child)
        self.live[child.request_id] = child

    @rule(prompt=st.lists(st.integers(1, 3), min_size=BS, max_size=3 * BS), pin=st.booleans())
    def register(self, prompt: list[int], pin: bool) -> None:
        try:
            self.kv.shared_prefixes.register(prompt, pin=pin)
        except ValueError:
            pass  # pin capacity

    @precondition(lambda self: len(self.kv.shared_prefixes) > 0)
    @rule(data=st.data(), action=st.sampled_from(("pin", "unpin", "unregister")))
    def change_prefix(self, data: st.DataObject, action: str) -> None:
        prefix = data.draw(st.sampled_from(self.kv.shared_prefixes.prefixes()))
        try:
            getattr(self.kv.shared_prefixes, action)(prefix.prefix_id)
        except ValueError:
            pass
