"""A torch-free simulation of the engine loop, for scheduler and policy tests.

It drives the real request lifecycle (`Scheduler.update_from_output`) with a fake model in place
of the runner; only the model differs from `LLMEngine.step`.

The "model" is a deterministic function of the token prefix, so any correct schedule
(chunked, preempted, reordered) must produce exactly the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weir.engine.config import SchedulerConfig
from weir.engine.kv.block_hash import CacheKeyRoot
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Priority, Request, SamplingParams
from weir.engine.scheduling.scheduler import Scheduler
from weir.engine.text.output_processor import OutputProcessor


def next_token(tokens: list[int]) -> int:
    """The fake model: a hash of the whole prefix."""
    h = 7
    for t in tokens:
        h = (h * 31 + t) % 1_000_003
    return h % 1000


def sim_request(rid: str, prompt: list[int], max_tokens: int, **kwargs: Any) -> Request:
    """A greedy request that ends at `max_tokens` (no tokenizer, no end tokens), as the sim serves."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    req = Request(rid, list(prompt), params, **kwargs)
    req.checker = OutputProcessor(None, req.prompt_token_ids, params, eos_token_ids=())
    return req


@dataclass
class SimClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Sim:
    """Scheduler + KV manager driven by the fake model."""

    config: SchedulerConfig
    num_blocks: int = 64
    block_size: int = 4
    caching: bool = True
    tenant_cache_share: float = 1.0
    host_num_blocks: int = 0  # the host KV tier (swapping, demotions); 0: none
    clock: SimClock = field(default_factory=SimClock)

    def __post_init__(self) -> None:
        self.kv = KVCacheManager(
            self.num_blocks + 1,
            self.block_size,
            lambda scope: CacheKeyRoot("m", "t", "r", "float32", scope).digest(),
            enable_caching=self.caching,
            watermark=0.0,
            tenant_cache_share=self.tenant_cache_share,
            host_num_blocks=self.host_num_blocks,
        )
        self.sched = Scheduler(self.config, self.kv, clock=self.clock)
        self.outputs: dict[str, list[int]] = {}
        self.served: dict[str, int] = {}
        self.steps: list = []

    def add(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        tenant: str = "t",
        priority: Priority = Priority.STANDARD,
    ) -> Request:
        req = sim_request(
            rid,
            prompt,
            max_tokens,
            tenant_id=tenant,
            priority=priority,
            cache_scope=tenant,
            arrival_s=self.clock.now,
        )
        self.sched.add_request(req)
        self.outputs[rid] = []
        return req

    def step(self) -> None:
        out = self.sched.schedule()
        self.steps.append(out)
        # the runner's view: tokens fed must be the known ones at the right positions
        sampled = {}
        for s in out.scheduled:
            req = self.sched.requests[s.request_id]
            assert s.num_computed_tokens == req.num_computed_tokens
            assert s.num_computed_tokens + s.num_tokens <= req.num_tokens
            assert len(s.block_ids) * self.block_size >= s.num_computed_tokens + s.num_tokens
            self.served[req.tenant_id] = self.served.get(req.tenant_id, 0) + s.num_tokens
            if s.samples:
                sampled[s.request_id] = next_token(req.all_token_ids)
        update = self.sched.update_from_output(out, sampled)
        assert not update.failed, update.failed
        for appended in update.appended:
            self.outputs[appended.request.request_id].append(appended.token_id)
        self.clock.now += 0.01

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_unfinished():
                return
            self.step()
        raise AssertionError("simulation did not finish")


def reference_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    out = []
    for _ in range(max_tokens):
        t = next_token(tokens)
        tokens.append(t)
        out.append(t)
    return out
