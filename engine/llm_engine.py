"""The synchronous engine core: add requests, step, get outputs.

One `step()` = schedule -> run the model -> `Scheduler.update_from_output` (advance, append
sampled tokens after detokenizing and checking stops, free finished requests' blocks) -> the
callers' outputs. `weir.engine.async_engine` drives it from a background thread; tests and the
offline benchmark drive it directly.

Fault containment: a failure in one request's own work (its inputs, its sampling, its stop
checks and detokenization, its beam bookkeeping) fails that request only. A failed model forward
requeues the step's requests that have not streamed a token (once; their blocks are recomputed)
and fails the others with `ENGINE_RETRYABLE`. `reset()` rebuilds the scheduler and KV state
around the same weights when the async loop itself broke.

What the engine holds beside the scheduler has modules of its own: the KV cache manager and its
tiers are built by `KVTiers` (engine/kv_tiers.py), the prefill and decode rates are
`MeasuredRates` (engine/measured_rates.py), what of the pool one request may hold is
engine/kv/request_capacity.py, and adapters are loaded through `AdapterAdmin`
(engine/adapter_admin.py) as the prefix cache is administered through `PrefixCacheAdmin`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from weir.engine.adapter_admin import AdapterAdmin
from weir.engine.client import EngineRequest
from weir.engine.config import EngineConfig, ModelConfig
from weir.engine.engine_stats import EngineStats, StepTimeTotals
from weir.engine.engine_tokenizer import own_tokenizer, tokenizer_fingerprint
from weir.engine.errors import DEADLINE_EXCEEDED, ENGINE_RETRYABLE, ContextLengthError, InvalidRequestError
from weir.engine.faults import FaultInjector
from weir.engine.kv.block_hash import SHARED_SCOPE
from weir.engine.kv.request_capacity import capped_max_model_len, check_kv_capacity, usable_blocks
from weir.engine.kv.store.tier import StoreIO
from weir.engine.kv_tiers import KVTiers
from weir.engine.lora.lora_types import UnknownAdapterError
from weir.engine.measured_rates import MeasuredRates
from weir.engine.output import RequestOutput, SchedulerOutput
from weir.engine.prefix_cache_admin import PrefixCacheAdmin
from weir.engine.request import FinishReason, RequestStatus
from weir.engine.runner.mask_prefetch import MaskPrefetcher
from weir.engine.runner.runner import ModelRunner
from weir.engine.sampling.sampler import SampleResult
from weir.engine.scheduling.scheduler import Scheduler
from weir.engine.scheduling.speculation_policy import SpeculationPolicy
from weir.engine.scheduling.stall_watchdog import StallWatchdog
from weir.engine.scheduling.step_budget import make_step_budget
from weir.engine.sequence_groups.beam_group import BeamGroups
from weir.engine.sequence_groups.choice_groups import ChoiceGroups
from weir.engine.spec_decode import engine_step as spec_step
from weir.engine.spec_decode.drafter import Drafter
from weir.engine.speculation_tally import SpeculationCounters

logger = logging.getLogger("weir.engine")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class LLMEngine:
    """Owns the scheduler, the KV cache manager and the model runner of one model version."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        tokenizer: Any,
        runner: ModelRunner,
        num_blocks: int,
        clock: Callable[[], float] = time.monotonic,
        faults: FaultInjector | None = None,
        drafter: Drafter | None = None,
        cpu_row_inputs: int = 0,
        store_io: StoreIO | None = None,
    ) -> None:
        self.config = config
        # The shared KV store's I/O threads (engine/kv/store/client.py); outlive reset().
        self.store_io = store_io if config.kv_store is not None else None
        self.cpu_row_inputs = cpu_row_inputs  # what the model's linears were built with, for /metrics
        self.drafter = drafter  # speculative decoding's proposer; None: no speculation
        self.spec_counters = SpeculationCounters()  # monotonic: kept across reset()
        self.model_config = model_config
        self.tokenizer = tokenizer  # the callers' (gateway threads); the engine thread has its own
        self._engine_tokenizer = own_tokenizer(tokenizer)
        self.runner = runner
        self.clock = clock
        self.faults = faults  # tests only; None in production
        if faults is not None:
            runner.faults = faults
        self.masks = MaskPrefetcher(config.masks, clock)  # grammar masks, computed ahead of their steps
        runner.masks = self.masks
        self.max_model_len = min(config.scheduler.max_model_len, model_config.max_model_len)
        # Outlives the scheduler (reset rebuilds it): the cost per token is the machine's, not its state's.
        self.step_budget = make_step_budget(config.scheduler)
        # Outlives the scheduler too: its stall count is monotonic, like the restarts.
        self.watchdog = StallWatchdog(config.scheduler.max_stalled_steps)
        self.rates = MeasuredRates(self.step_budget)  # prefill and decode rates, kept across reset()
        self.kv_tiers = KVTiers(
            config,
            model_config,
            tokenizer_fingerprint(tokenizer),
            num_blocks,
            runner.host_kv,
            self.rates,
            clock,
            self.store_io,
        )
        self._build_state()
        capped = capped_max_model_len(self.kv, self.max_model_len)
        if capped != self.max_model_len:  # the scheduler is built with it
            self.max_model_len = capped
            self._build_state()
        self.step_times = StepTimeTotals()  # model-runner steps and seconds, decode / prefill
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        self.num_restarts = 0
        self.last_step_idle = False  # the last step scheduled nothing and changed nothing

    def _build_state(self) -> None:
        """A fresh scheduler, KV cache manager and request maps (the KV tensors are the runner's)."""
        config = self.config
        self.kv = self.kv_tiers.build()
        self.scheduler = Scheduler(
            replace(config.scheduler, max_model_len=self.max_model_len),
            self.kv,
            clock=self.clock,
            step_budget=self.step_budget,
        )
        self.choices = ChoiceGroups(
            self.scheduler, self.runner, self._engine_tokenizer, self.model_config.eos_token_ids
        )
        self.beams = BeamGroups(
            self.scheduler, self._engine_tokenizer, self.model_config.eos_token_ids, self.clock
        )
        self.prefix_cache = PrefixCacheAdmin(self.kv, config.model_version, self.model_config.vocab_size)
        self.adapter_admin = AdapterAdmin(self.runner.lora, self.scheduler.requests)
        if self.drafter is not None:
            self.scheduler.speculation = SpeculationPolicy(config.speculative, self.spec_counters)
            self.drafter.forget_all()

    @property
    def num_blocks_per_request(self) -> int:
        """The most blocks one sequence may ever hold: the pool less the admission watermark."""
        return usable_blocks(self.kv)

    def reset(self) -> None:
        """Forget every request and rebuild the scheduler and KV state; weights and KV tensors stay.

        For the async loop after an exception it could not contain: the old state may be
        inconsistent, so nothing of it is trusted. Cumulative counters carry over (metrics are
        monotonic) and registered shared prefixes are registered again (their blocks are
        recomputed on first use).
        """
        old_kv, old_scheduler = self.kv, self.scheduler
        self._build_state()
        self.kv.lookup.totals, self.kv.lookup.by_tenant = old_kv.lookup.totals, old_kv.lookup.by_tenant
        if old_kv.host is not None and self.kv.host is not None:
            self.kv.host.carry_counters(old_kv.host)
        self.scheduler.preemption.num_preemptions = old_scheduler.num_preemptions
        self.scheduler.slo.carry_over(old_scheduler.slo)
        for prefix in old_kv.shared_prefixes.prefixes():
            try:
                self.kv.shared_prefixes.register(prefix.token_ids, prefix.name, prefix.pinned)
            except Exception:  # a prefix that cannot come back is dropped, not the restart
                logger.exception("could not register shared prefix %s again", prefix.prefix_id)
        self.runner.forget_all()
        self.num_restarts += 1
        self.last_step_idle = False

    # -- requests ---------------------------------------------------------------------------

    def validate(self, er: EngineRequest) -> None:
        """Raise InvalidRequestError for a request that must never enter the queue."""
        vocab = self.model_config.vocab_size
        if not er.prompt_token_ids:
            raise InvalidRequestError("prompt must contain at least one token", "prompt")
        if any(not 0 <= t < vocab for t in er.prompt_token_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
        sp = er.sampling_params
        if sp.use_beam_search:
            if er.constraint is not None:
                raise InvalidRequestError(
                    "structured outputs and tools are not supported with beam search", "use_beam_search"
                )
            self.beams.validate(er)
        if er.cache_scope == SHARED_SCOPE:
            raise InvalidRequestError("this cache scope is reserved", "cache_scope")
        if er.adapter_name is not None:
            lora = self.runner.lora
            if lora is None or not lora.has(er.adapter_name):
                raise UnknownAdapterError(er.adapter_name)
        # The seed and the other sampling bounds: `SamplingParams` checked them when it was built.
        ContextLengthError.check(len(er.prompt_token_ids), sp.max_tokens, self.max_model_len)
        check_kv_capacity(self.kv, len(er.prompt_token_ids), sp)
        if self.is_active(er.request_id):
            raise InvalidRequestError(f"duplicate request id {er.request_id!r}", "request_id")

    def add_request(self, er: EngineRequest) -> None:
        """Validate and queue a request (and its n choices).

        The n choices of a sampled request share its prompt: the first computes it, the others
        fork from it (copy-on-write) and compute only the last prompt token for their own sample.
        """
        self.validate(er)
        if er.adapter_name is not None and self.runner.lora is not None:
            ref = self.runner.lora.ref(er.adapter_name)
            er = replace(er, adapter_fingerprint=ref.fingerprint)
        sp = er.sampling_params
        if sp.use_beam_search:
            self.beams.add(er)
            return
        self.choices.add(er)

    def abort(self, request_id: str) -> list[RequestOutput]:
        """Abort every choice of a request; its blocks are freed now."""
        if self.beams.is_active(request_id):
            return self.beams.abort(request_id, FinishReason.ABORT)
        return self.choices.abort(request_id)

    def is_active(self, request_id: str) -> bool:
        """Whether any choice of the request is still queued or running."""
        return self.choices.is_active(request_id) or self.beams.is_active(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- stepping ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration and return the outputs it produced.

        Sets `last_step_idle` when nothing was scheduled and nothing preempted: only a new
        request, an abort or time (see `idle_timeout_s`) can change the next decision.
        """
        step_start = self.clock()
        outputs = self._expire()
        for rid, error in self.masks.overdue(self.scheduler.requests):
            outputs.extend(self._fail_request(rid, error))
        self.masks.start(self.scheduler.running.values())
        if self.faults is not None:
            self.faults.before_schedule()
        has_work = self.scheduler.has_work()
        out = self.scheduler.schedule()
        if not out.num_tokens and has_work and self.masks.num_pending:
            # Requests sitting out for their grammar masks wait on a worker (and time out): no stall.
            has_work = not any(r.awaits_mask for r in self.scheduler.running.values())
        if self.watchdog.observe(out.num_tokens, has_work):
            self._break_stall()
        self.last_step_idle = not out.scheduled and not out.preempted_ids and not outputs
        if out.is_empty:
            self.runner.forget(out.finished_ids)
            return outputs
        drafts = spec_step.propose(self.drafter, out, self.scheduler.requests)
        t0 = self.clock()
        try:
            result = self.runner.execute(out, self.scheduler.requests, drafts)
        except Exception:  # the step as a whole failed: only its requests are affected
            logger.exception("engine step failed; retrying or failing its %d requests", len(out.scheduled))
            return outputs + self._recover_step(out)
        elapsed = self.clock() - t0
        for rid, error in result.failed.items():
            outputs.extend(self._fail_request(rid, error))
        self._measure(out, elapsed)
        tokens: dict[str, SampleResult] = {}
        beam_results: dict[str, SampleResult] = {}
        for rid, res in result.sampled.items():
            try:
                if self.faults is not None:
                    self.faults.before_output(rid)
            except Exception as exc:
                logger.exception("processing the output of request %s failed", rid)
                outputs.extend(self._fail_request(rid, _describe(exc)))
                continue
            (beam_results if self.beams.owns(rid) else tokens)[rid] = res
        verified = spec_step.verdicts(result, tokens)
        update = self.scheduler.update_from_output(
            out, {rid: res.token_id for rid, res in tokens.items()}, verified, result.sat_out
        )
        for rid, error in update.failed.items():
            outputs.extend(self._fail_request(rid, error))
        for appended, res in zip(
            update.appended, spec_step.appended_results(update.appended, result, tokens), strict=True
        ):
            outputs.append(self.choices.output(appended, res.logprob))
        self.num_generation_tokens_total += len(update.appended)
        for rid, res in beam_results.items():
            if rid in self.scheduler.requests:  # not failed with its group meanwhile
                self.beams.on_result(rid, res.logprob)
        outputs.extend(self.beams.advance())
        # The whole step (schedule, forward, outputs) is what a running request waits between tokens.
        self.step_budget.observe(
            spec_step.num_tokens_fed(out, result),
            self.clock() - step_start,
            out.num_decodes,
            out.num_decode_context_tokens,
        )
        return outputs

    def run_pending_transfers(self) -> None:
        """With nothing to step, carry out the block transfers decided since the last step now (the
        store's write-behind of the requests that just ended), so they do not wait for the next
        request. A failure drops them (the store is an optimisation) and forgets what they filled."""
        if not self.kv.copy_plan.has_pending_transfers():
            return
        transfers = self.kv.copy_plan.take_transfers()
        try:
            self.runner.transfer_blocks(SchedulerOutput(scheduled=(), swaps=transfers))
        except Exception:
            logger.exception("block transfers of an idle engine failed; dropped")
            self.kv.copy_plan.forget_transfers(transfers)

    def idle_timeout_s(self, default_s: float) -> float:
        """How long the caller may sleep after an idle step before time alone changes anything
        (a grammar mask that becomes ready wakes the caller through `masks.on_ready`)."""
        timeout = self.scheduler.idle_timeout_s(default_s)
        deadline = self.masks.next_deadline_s()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - self.clock()))
        return timeout

    def _expire(self) -> list[RequestOutput]:
        expired: list[RequestOutput] = []
        for late in self.scheduler.expire_deadlines():
            group_id = self.beams.group_of(late.request_id)
            if group_id is not None:
                expired.extend(self.beams.abort(group_id, FinishReason.ABORT, DEADLINE_EXCEEDED))
            else:
                expired.append(
                    self.choices.finish(late, FinishReason.ABORT, "", None, error=DEADLINE_EXCEEDED)
                )
        return expired

    def _break_stall(self) -> None:
        """The watchdog saw `max_stalled_steps` steps without a token while work existed: say so
        loudly, with the state that explains it, and preempt to break it."""
        state = self.scheduler.describe()
        victim = self.scheduler.preemption.break_stall()
        logger.error(
            "engine stall: %d steps fed no token while work existed (stall #%d); preempted %s\n%s",
            self.watchdog.max_stalled_steps,
            self.watchdog.num_stalls,
            victim.request_id if victim is not None else "nobody (nothing runs)",
            state,
        )

    def _measure(self, out: SchedulerOutput, elapsed: float) -> None:
        prefill = sum(s.num_tokens for s in out.scheduled if s.num_tokens > 1 or not s.samples)
        self.num_prompt_tokens_total += prefill
        self.step_times = self.step_times.plus(prefill=bool(prefill), seconds=elapsed)
        self.rates.observe(prefill, elapsed)

    def _fail_request(self, request_id: str, error: str) -> list[RequestOutput]:
        """Fail one scheduler request (a choice, or a beam: its whole group) with `error`."""
        group_id = self.beams.group_of(request_id)
        if group_id is not None:
            return self.beams.fail(group_id, error)
        return self.choices.fail(request_id, error)

    def _recover_step(self, out: SchedulerOutput) -> list[RequestOutput]:
        """The model forward (or something shared by the whole step) raised.

        The KV written in this step is not trusted. A request that has not streamed a token is
        requeued once and recomputes its blocks; the others fail with `ENGINE_RETRYABLE`
        (the gateway answers 503, which clients retry).
        """
        outs: list[RequestOutput] = []
        for s in out.scheduled:
            req = self.scheduler.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            streamed = req.num_output_tokens > 0 and not self.beams.owns(req.request_id)
            if not streamed and req.num_retries == 0:
                req.num_retries += 1
                self.scheduler.preemption.requeue(req)
            else:
                outs.extend(self._fail_request(req.request_id, ENGINE_RETRYABLE))
        self.scheduler.preemption.discard_swaps(
            out, self.scheduler.requests
        )  # the step's swaps may not have run: recompute instead
        return outs

    # -- introspection ----------------------------------------------------------------------

    def _native_decode_steps(self) -> int:
        """Decode steps whose layers ran in one C call (0 where the model has no such path)."""
        native = getattr(self.runner.model, "native_decode", None)
        return int(native.steps_taken) if native is not None else 0

    def stats(self) -> EngineStats:
        by_prio = self.scheduler.waiting.waiting_tokens_by_priority
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_total_blocks=self.kv.num_total_blocks,
            num_free_blocks=self.kv.num_free_blocks,
            block_size=self.kv.block_size,
            num_waiting_tokens=sum(by_prio),
            prefix_cache_queries=self.kv.lookup.totals.queried_tokens,
            prefix_cache_hits=self.kv.lookup.totals.hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prefill_tokens_per_s=self.rates.prefill.value,
            decode_steps_per_s=self.rates.decode.value,
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total,
            waiting_tokens_by_priority=tuple(by_prio),
            running_by_priority=self.scheduler.running_by_priority,
            num_restarts=self.num_restarts,
            num_stalls=self.watchdog.num_stalls,
            num_grammar_masks_late=self.masks.num_late_rows,
            num_grammar_mask_timeouts=self.masks.num_timeouts,
            num_grammar_mask_workers_added=self.masks.num_extra_workers_started,
            step_times=self.step_times,
            step_budget=self.step_budget.stats(),
            host_kv=self.kv.host.stats() if self.kv.host is not None else None,
            kv_store=self.kv.store.stats() if self.kv.store is not None else None,
            num_spec_draft_tokens_total=self.spec_counters.num_drafted,
            num_spec_accepted_tokens_total=self.spec_counters.num_accepted,
            num_spec_emitted_tokens_total=self.spec_counters.num_emitted,
            adapters=self.adapter_admin.adapters(),
            slo=self.scheduler.slo.stats(),
            class_targets=self.scheduler.config.class_targets,
            cpu_row_inputs=self.cpu_row_inputs,
            native_decode_steps=self._native_decode_steps(),
            step_threads=self.runner.threads.stats() if self.runner.threads is not None else None,
        )
