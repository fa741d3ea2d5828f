"""The EngineClient the gateway uses: the engine core stepping in a background thread.

Callers live on an asyncio loop; the engine thread owns the core. Commands (add, abort) cross
into the thread through a queue; outputs cross back with one `call_soon_threadsafe` per event
loop per step (not one per request), and are put into the streams on the loop side. The thread
sleeps when there is nothing to do, and also when there is work it cannot schedule (it then
wakes for a new command, or when a deadline or batch window passes), so it never spins.

The engine survives itself: an exception that escapes a step (the scheduler, the output
processing, beam bookkeeping) fails the requests in flight with `RetryableEngineError` (503)
and restarts the loop on a clean scheduler and KV state (`LLMEngine.reset`); `health().ready` is
False meanwhile. More than `max_restarts` restarts within `restart_window_s` mean the fault
does not go away: the engine is then dead, as before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from weir.engine.client import EngineHealth, EngineRequest, PrefixCacheControl
from weir.engine.config import EngineConfig, ModelConfig
from weir.engine.engine_builder import build_engine
from weir.engine.engine_stats import EngineStats
from weir.engine.errors import EngineDeadError, RetryableEngineError
from weir.engine.llm_engine import LLMEngine
from weir.engine.lora.lora_types import AdapterInfo
from weir.engine.output import RequestOutput
from weir.engine.prefix_cache_admin import AsyncPrefixCache, PrefixCacheAdmin
from weir.engine.request import SamplingParams

logger = logging.getLogger("weir.engine")

T = TypeVar("T")

# The prefix-cache snapshot that metrics read is refreshed at most this often (engine thread).
PREFIX_SNAPSHOT_INTERVAL_S = 1.0
# The longest the engine thread sleeps without a reason to wake (it refreshes stats then).
IDLE_WAIT_S = 0.5
# More restarts than this within the window and the engine is declared dead.
MAX_RESTARTS = 5
# Abort reports of streams closed early that no `abort` call has read yet (others' callers): bounded.
MAX_ABORT_REPORTS = 4096
RESTART_WINDOW_S = 60.0


_Sink = asyncio.Queue[RequestOutput | BaseException]
# One stream's share of a hand-off: its sink and what goes into it, in order.
_SinkBatch = tuple[_Sink, Sequence[RequestOutput | BaseException]]


@dataclass(frozen=True)
class _Add:
    request: EngineRequest
    sink: _Sink
    loop: asyncio.AbstractEventLoop


@dataclass(frozen=True)
class _Abort:
    """Abort a request; `future` (when set) receives the prompt tokens it had computed."""

    request_id: str
    future: asyncio.Future[int | None] | None = None
    loop: asyncio.AbstractEventLoop | None = None


@dataclass(frozen=True)
class _Call:
    """Run `fn(core)` on the engine thread and resolve `future` with its result."""

    fn: Callable[[LLMEngine], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


class AsyncEngine:
    """Runs an LLMEngine on a background thread and streams its outputs to asyncio callers."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        core: LLMEngine | None = None,
        max_restarts: int = MAX_RESTARTS,
        restart_window_s: float = RESTART_WINDOW_S,
    ) -> None:
        if core is None:
            if config is None:
                raise ValueError("config or core is required")
            core = build_engine(config)
        self.core = core
        self._commands: queue.SimpleQueue[_Add | _Abort | _Call | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        core.masks.on_ready = self._wake.set  # a grammar mask computed ahead wakes an idle engine
        if core.store_io is not None:
            core.store_io.on_ready = self._wake.set  # so does a KV store fetch that ended
        self._sinks: dict[str, _Add] = {}  # engine thread: where each request's outputs go
        # Event loop side: the streams `generate` has open and not yet aborted, by request id.
        self._open: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._abort_reports: collections.OrderedDict[str, asyncio.Future[int | None]] = (
            collections.OrderedDict()
        )
        self._thread: threading.Thread | None = None
        self._stats = core.stats()
        self._prefix_stats = core.prefix_cache.stats()
        self._prefix_stats_at = time.monotonic()
        # The prefix cache's admin facade: each call runs on the engine thread.
        self.prefix_cache: PrefixCacheControl = AsyncPrefixCache(
            self._on_prefix_cache_admin, self.generate, lambda: self._prefix_stats
        )
        self._ready = False
        self._dead: BaseException | None = None
        self._stopping = False
        self._restarting = False
        self._restart_times: list[float] = []
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.num_steps = 0  # engine steps run by the thread
        self.num_idle_waits = 0  # steps that scheduled nothing, after which the thread slept

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.core.tokenizer

    @property
    def model_config(self) -> ModelConfig:
        return self.core.model_config

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, warmup: bool = True) -> None:
        """Start the engine thread and warm the model up with one short request."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="weir-engine", daemon=True)
        self._thread.start()
        if warmup:
            req = EngineRequest(
                request_id=f"warmup-{time.monotonic_ns()}",
                prompt_token_ids=(0,) * 8,
                sampling_params=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
                tenant_id="__warmup__",
                cache_scope="__warmup__",
            )
            async for _ in self.generate(req):
                pass
            self.core.rates.forget()  # the warm-up's rates measure no one's prompt
        self._ready = True

    async def shutdown(self) -> None:
        """Stop the engine thread; requests still running are aborted."""
        self._stopping = True
        self._ready = False
        self._commands.put(None)
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
            self._thread = None
        self.core.masks.close()
        if self.core.store_io is not None:
            await asyncio.to_thread(self.core.store_io.close)  # waits for the write thread, bounded

    # -- EngineClient -----------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Queue a request and stream its outputs.

        The engine thread validates it (the state validation reads is that thread's): an invalid
        request raises from the first iteration, before any output. Closing the stream before its
        last output aborts the request, unless `abort` was called for it already.
        """
        if self._dead is not None or self._stopping:
            raise EngineDeadError(str(self._dead) if self._dead else "engine is shutting down")
        loop = asyncio.get_running_loop()
        sink: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        rid = request.request_id
        self._open.setdefault(rid, sink)  # a duplicate id is refused by the engine; the first stream keeps it
        self._commands.put(_Add(request, sink, loop))
        self._wake.set()
        remaining = request.sampling_params.n
        try:
            while remaining:
                item = await sink.get()
                if isinstance(item, BaseException):
                    remaining = 0  # refused or failed: nothing is left to abort
                    raise item
                if item.finished:
                    remaining -= 1
                yield item
        finally:
            if self._open.get(rid) is sink:
                del self._open[rid]
                if remaining:
                    # Closed early (or its task cancelled): the caller's `abort` reads the report.
                    self._abort_reports[rid] = self._send_abort(rid, loop)
                    while len(self._abort_reports) > MAX_ABORT_REPORTS:
                        self._abort_reports.popitem(last=False)

    async def abort(self, request_id: str) -> int | None:
        """Abort a request streaming from `generate`; it is sent to the engine once, whoever asks first.

        Returns the prompt tokens the engine had computed for it (prefix-cache hits included),
        which are billed though no token came; None when it was not running here (unknown, ended
        already) or the engine is not running.
        """
        loop = asyncio.get_running_loop()
        if self._open.pop(request_id, None) is not None:
            report = self._send_abort(request_id, loop)
        else:
            pending = self._abort_reports.pop(request_id, None)
            if pending is None:
                return None
            report = pending
        if self._thread is None or self._dead is not None:
            return None  # nobody drains the command; `_fail_calls` answers the ones queued at death
        return await report

    def _send_abort(self, request_id: str, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int | None]:
        future: asyncio.Future[int | None] = loop.create_future()
        self._commands.put(_Abort(request_id, future, loop))
        self._wake.set()
        return future

    def stats(self) -> EngineStats:
        return self._stats

    def health(self) -> EngineHealth:
        alive = self._thread is not None and self._thread.is_alive() and self._dead is None
        detail = f"engine thread died: {self._dead}" if self._dead else ""
        if alive and self._restarting:
            detail = "engine restarting after an internal error"
        return EngineHealth(alive=alive, ready=alive and self._ready and not self._restarting, detail=detail)

    # -- prefix cache: calls that run on the engine thread ------------------------------------

    async def _call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(core)` on the engine thread (directly when the thread is not running)."""
        if self._dead is not None or self._stopping:
            raise EngineDeadError(str(self._dead) if self._dead else "engine is shutting down")
        if self._thread is None:
            return fn(self.core)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._commands.put(_Call(fn, future, loop))
        self._wake.set()
        return await future

    # -- LoRA adapters ------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Read and check the adapter on a worker thread, then hold it on the engine thread, so
        steps never wait on the disk. Raises AdapterLoadError, AdapterInUseError."""
        adapter = await asyncio.to_thread(self.core.adapter_admin.read_adapter, name, path)
        return await self._call(lambda core: core.adapter_admin.add_adapter(adapter))

    async def unload_adapter(self, name: str) -> AdapterInfo:
        """Forget an adapter; AdapterInUseError while a request through it is queued or running."""
        return await self._call(lambda core: core.adapter_admin.unload_adapter(name))

    async def adapters(self) -> tuple[AdapterInfo, ...]:
        return await self._call(lambda core: core.adapter_admin.adapters())

    def _on_prefix_cache_admin(self, fn: Callable[[PrefixCacheAdmin], T]) -> Awaitable[T]:
        """Run `fn` on the engine thread with the core's prefix-cache admin (as of that moment)."""
        return self._call(lambda core: fn(core.prefix_cache))

    # -- engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._loop()
                break
            except Exception as exc:  # something the step did not contain: restart clean
                if not self._restart(exc):
                    return
            except BaseException as exc:  # the thread itself is being torn down
                self._die(exc)
                return
        for rid in list(self._sinks):
            self._deliver(self.core.abort(rid))
        self._fail_calls(EngineDeadError("engine is shutting down"))

    def _loop(self) -> None:
        core = self.core
        while True:
            if not self._drain_commands():
                return
            if not core.has_unfinished():
                core.run_pending_transfers()  # the last requests' blocks go to the KV store now
                self._stats = core.stats()
                self._refresh_prefix_stats()
                self._sleep(IDLE_WAIT_S)
                continue
            outputs = core.step()
            self.num_steps += 1
            self._stats = core.stats()
            self._refresh_prefix_stats()
            self._deliver(outputs)
            if core.last_step_idle:  # nothing schedulable: wait for a command, or for time to pass
                self.num_idle_waits += 1
                self._sleep(core.idle_timeout_s(IDLE_WAIT_S))

    def _sleep(self, timeout_s: float) -> None:
        # Commands are drained after the clear, so a wake-up set meanwhile is never lost.
        self._wake.wait(timeout_s)
        self._wake.clear()

    def _restart(self, exc: Exception) -> bool:
        """Reset the core and fail the requests in flight (retryable); False if the engine is dead now."""
        logger.exception("engine loop failed; restarting it and failing the requests in flight")
        self._restarting = True
        now = time.monotonic()
        self._restart_times = [t for t in self._restart_times if now - t < self.restart_window_s]
        self._restart_times.append(now)
        if len(self._restart_times) > self.max_restarts:
            logger.error(
                "the engine restarted %d times within %.0f s; giving up",
                len(self._restart_times),
                self.restart_window_s,
            )
            self._restarting = False
            self._die(exc)
            return False
        try:
            if self.core.faults is not None:
                self.core.faults.on_restart()
            self.core.reset()
            self._stats = self.core.stats()
        except BaseException as fatal:  # the reset itself failed: nothing left to serve with
            logger.exception("engine restart failed")
            self._restarting = False
            self._die(fatal)
            return False
        self._restarting = False
        failure = RetryableEngineError(
            f"the engine restarted after an internal error ({type(exc).__name__}); retry the request"
        )
        self._fail_sinks(failure)
        return True

    def _die(self, exc: BaseException) -> None:
        """The loop cannot go on: fail everyone and report dead."""
        logger.error("engine loop died: %r", exc)
        self._dead = exc
        self._fail_sinks(EngineDeadError(str(exc)))
        self._fail_calls(EngineDeadError(str(exc)))

    def _refresh_prefix_stats(self) -> None:
        now = time.monotonic()
        if now - self._prefix_stats_at >= PREFIX_SNAPSHOT_INTERVAL_S:
            self._prefix_stats = self.core.prefix_cache.stats()
            self._prefix_stats_at = now

    def _fail_calls(self, exc: BaseException) -> None:
        """Answer control calls still queued when the loop ends."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Call):
                cmd.loop.call_soon_threadsafe(_resolve, cmd.future, None, exc)
            elif isinstance(cmd, _Abort) and cmd.future is not None and cmd.loop is not None:
                cmd.loop.call_soon_threadsafe(_resolve, cmd.future, None, None)

    def _drain_commands(self) -> bool:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
            if cmd is None:
                return False
            if isinstance(cmd, _Call):
                try:
                    result = cmd.fn(self.core)
                except Exception as exc:  # reported to the caller only
                    cmd.loop.call_soon_threadsafe(_resolve, cmd.future, None, exc)
                else:
                    cmd.loop.call_soon_threadsafe(_resolve, cmd.future, result, None)
                continue
            if isinstance(cmd, _Add):
                try:
                    self.core.add_request(cmd.request)
                except Exception as exc:  # validation raced or failed: only this caller hears of it
                    cmd.loop.call_soon_threadsafe(cmd.sink.put_nowait, exc)
                    continue
                self._sinks[cmd.request.request_id] = cmd
            else:
                outputs = self.core.abort(cmd.request_id)
                self._deliver(outputs)
                if cmd.future is not None and cmd.loop is not None:
                    computed = max((o.num_computed_prompt_tokens for o in outputs), default=None)
                    cmd.loop.call_soon_threadsafe(_resolve, cmd.future, computed, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their streams: one `call_soon_threadsafe` per event loop.

        Each thread-safe call takes a lock and writes to the loop's self-pipe, and the loop then
        wakes and runs one callback; once per request per step, that is per-token work on both
        threads. The outputs are grouped here by request (order kept) and by loop, and put into
        the per-request sinks by one callback on the loop side.
        """
        if not outputs:
            return
        by_sink: dict[str, list[RequestOutput]] = {}
        for out in outputs:
            outs = by_sink.get(out.request_id)
            if outs is None:
                by_sink[out.request_id] = [out]
            else:
                outs.append(out)
        batches: dict[asyncio.AbstractEventLoop, list[_SinkBatch]] = {}
        sinks, is_active = self._sinks, self.core.is_active
        for rid, outs in by_sink.items():
            add = sinks.get(rid)
            if add is None:
                continue
            batch = batches.get(add.loop)
            if batch is None:
                batches[add.loop] = [(add.sink, outs)]
            else:
                batch.append((add.sink, outs))
            if not is_active(rid):
                del sinks[rid]
        for loop, batch in batches.items():
            loop.call_soon_threadsafe(_dispatch, batch)

    def _fail_sinks(self, exc: BaseException) -> None:
        """Fail every stream in flight with `exc`: one callback per event loop."""
        batches: dict[asyncio.AbstractEventLoop, list[_SinkBatch]] = {}
        for add in self._sinks.values():
            batches.setdefault(add.loop, []).append((add.sink, [exc]))
        self._sinks.clear()
        for loop, batch in batches.items():
            loop.call_soon_threadsafe(_dispatch, batch)


def _resolve(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # the caller gave up (cancelled)
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _dispatch(batch: list[_SinkBatch]) -> None:
    """Loop side of `_deliver`: put each stream's outputs (or its failure) into its sink, in order."""
    for sink, items in batch:
        for item in items:
            sink.put_nowait(item)
