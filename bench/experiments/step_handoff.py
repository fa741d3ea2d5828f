"""Per-step Python around the engine (issue 27, item 3): the output hand-off and the SSE chunk.

`python -m weir_bench.experiments.step_handoff [--streams 32] [--steps 400] [--rounds 5]`

Two in-process micro-benchmarks, each timing the current code against the previous one,
alternated `--rounds` times in one run (the machine is shared: the spread across rounds is
printed, not one figure):

- hand-off: `AsyncEngine._deliver` of one step's outputs for `--streams` streams, from a
  thread, until the event loop has put every output in its stream. Before: one
  `call_soon_threadsafe` per request per step; after: one per loop per step. Microseconds per
  step, with the loop callbacks counted.
- SSE: formatting one streamed token's chunk (`ChatFormatter.output_chunks`, no logprobs), by
  serializing the whole choice dict (before) or splicing the text (after). Microseconds per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from weir.engine.async_engine import AsyncEngine, _Add
from weir.engine.client import EngineRequest
from weir.engine.engine_stats import EngineStats
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput
from weir.engine.request import SamplingParams
from weir.engine.runner.mask_prefetch import MaskPrefetcher
from weir.gateway.api.responses import ChatFormatter


class _NullCore:
    """What `_deliver` reads of the core: every request stays active."""

    class _Prefix:
        def stats(self) -> None:
            return None

    prefix_cache = _Prefix()
    masks = MaskPrefetcher()  # no constrained request: its pool never starts
    store_io = None  # no KV store tier

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 1, 1, 16, 0, 0)

    def is_active(self, request_id: str) -> bool:
        return True


class _PerRequestEngine(AsyncEngine):
    """The hand-off before issue 27: one `call_soon_threadsafe` per request per step."""

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        by_sink: dict[str, list[RequestOutput]] = {}
        for out in outputs:
            by_sink.setdefault(out.request_id, []).append(out)
        for rid, outs in by_sink.items():
            add = self._sinks.get(rid)
            if add is None:
                continue
            add.loop.call_soon_threadsafe(_put_all, add.sink, outs)
            if not self.core.is_active(rid):
                del self._sinks[rid]


def _put_all(sink: asyncio.Queue[RequestOutput | BaseException], outs: list[RequestOutput]) -> None:
    for o in outs:
        sink.put_nowait(o)


async def _handoff_us(engine_cls: type[AsyncEngine], num_streams: int, num_steps: int) -> tuple[float, int]:
    """Microseconds per step for the thread to hand over and the loop to consume; loop callbacks."""
    loop = asyncio.get_running_loop()
    engine = engine_cls(core=cast(LLMEngine, _NullCore()))
    sinks: list[asyncio.Queue[RequestOutput | BaseException]] = []
    num_callbacks = 0
    real = loop.call_soon_threadsafe

    def counting(fn: Callable[..., Any], *args: Any) -> Any:
        nonlocal num_callbacks
        num_callbacks += 1
        return real(fn, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=num_steps)
    for i in range(num_streams):
        sink: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        sinks.append(sink)
        engine._sinks[f"r{i}"] = _Add(EngineRequest(f"r{i}", (1,), params), sink, loop)
    steps = [
        [RequestOutput(f"r{i}", 0, (step,), " hi", False, None) for i in range(num_streams)]
        for step in range(num_steps)
    ]

    def engine_thread() -> None:
        for outputs in steps:
            engine._deliver(outputs)

    async def consume(sink: asyncio.Queue[RequestOutput | BaseException]) -> None:
        for _ in range(num_steps):
            await sink.get()

    start = time.perf_counter()
    thread = threading.Thread(target=engine_thread)
    thread.start()
    await asyncio.gather(*(consume(s) for s in sinks))
    elapsed = time.perf_counter() - start
    thread.join()
    loop.call_soon_threadsafe = real  # type: ignore[method-assign]
    return elapsed / num_steps * 1e6, num_callbacks


def _sse_us(spliced: bool, num_chunks: int) -> float:
    formatter = ChatFormatter("chatcmpl-0123456789abcdef", 1_700_000_000, "SmolLM2-135M", "fp_weir", str)
    out = RequestOutput("r", 0, (1,), " hello", False, None)
    entry = {"index": 0, "delta": {"content": out.new_text}, "logprobs": None, "finish_reason": None}
    assert formatter.output_chunks(0, out) == [formatter._chunk([entry])]  # the same bytes
    chunk: Callable[[], object]
    if spliced:
        chunk = lambda: formatter.output_chunks(0, out)  # noqa: E731
    else:
        chunk = lambda: [formatter._chunk([dict(entry, delta={"content": out.new_text})])]  # noqa: E731
    start = time.perf_counter()
    for _ in range(num_chunks):
        chunk()
    return (time.perf_counter() - start) / num_chunks * 1e6


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunks", type=int, default=20000)
    args = p.parse_args(argv)
    handoff: dict[str, list[float]] = {"before": [], "after": []}
    callbacks: dict[str, int] = {}
    sse: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, cls in (("before", _PerRequestEngine), ("after", AsyncEngine)):
            us, n = asyncio.run(_handoff_us(cls, args.streams, args.steps))
            handoff[name].append(us)
            callbacks[name] = n
        for name, spliced in (("before", False), ("after", True)):
            sse[name].append(_sse_us(spliced, args.chunks))
    print(f"hand-off, {args.streams} streams x {args.steps} steps, {args.rounds} rounds alternated:")
    for name in ("before", "after"):
        per_step = callbacks[name] / args.steps
        print(f"  {name:6}: {_spread(handoff[name])} us/step; {per_step:.0f} loop callbacks/step")
    print(f"SSE chat chunk, {args.chunks} chunks, {args.rounds} rounds alternated:")
    for name in ("before", "after"):
        print(f"  {name:6}: {_spread(sse[name])} us/chunk")


if __name__ == "__main__":
    main()
