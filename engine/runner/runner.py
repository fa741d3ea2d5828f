"""Turns a SchedulerOutput into tensors, runs the model, and samples.

The runner owns the KV cache tensors and the per-request sampling generators. It knows
nothing about queues or policies: it executes exactly the step it is given.

Fault containment: per-request work (gathering a request's input tokens, preparing its
sampling, sampling its row) is isolated, so an exception for one request leaves it out of the
step and reports it in `StepResult.failed`; the others run. What is shared by the whole step
(block copies, the tensors, the model forward) raises to the caller, which decides for every
request of the step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from weir.engine.errors import InvalidRequestError
from weir.engine.faults import FaultInjector
from weir.engine.kv.host_kv_tensors import HostKVCopier
from weir.engine.kv.store.tensors import StoreBlockIO
from weir.engine.lora.lora_manager import LoraManager
from weir.engine.models.attention import AttentionMetadata
from weir.engine.output import ScheduledRequest, SchedulerOutput
from weir.engine.request import Request
from weir.engine.runner.cuda_graphs import DecodeGraphs
from weir.engine.runner.mask_prefetch import MaskPrefetcher
from weir.engine.runner.step_threads import StepThreads
from weir.engine.sampling.draft_verifier import Draft, Verification, Verifier
from weir.engine.sampling.sampler import Sampler, SampleResult, SamplingContext, has_penalty, make_generator
from weir.engine.sampling.token_counts import TokenCounts

logger = logging.getLogger("weir.engine")


@dataclass
class StepResult:
    """What one executed step produced: a token per sampling request, or why a request failed."""

    sampled: dict[str, SampleResult] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # request id -> error, for that request only
    # Requests that verified drafts: their accepted drafts (`sampled` holds the token after them).
    verified: dict[str, Verification] = field(default_factory=dict)
    # Requests fed to sample whose grammar mask was not ready: they sit the step out, unsampled.
    sat_out: list[str] = field(default_factory=list)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _adapter_name(req: Request) -> str | None:
    return req.adapter.name if req.adapter is not None else None


class ModelRunner:
    """Executes steps of one model on one device."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[torch.Tensor],
        block_size: int,
        device: torch.device,
        sampler: Sampler | None = None,
        graphs: DecodeGraphs | None = None,
        faults: FaultInjector | None = None,
        host_kv: HostKVCopier | None = None,
        lora: LoraManager | None = None,
        threads: StepThreads | None = None,
    ) -> None:
        self.model = model
        # Grammar masks computed ahead (set by the engine); None: each is computed in the sampler.
        self.masks: MaskPrefetcher | None = None
        self.threads = threads  # the CPU's intra-op threads per step; None: as the process set them
        self.lora = lora  # the LoRA adapters and slots; None: no adapters
        self.host_kv = host_kv  # the host KV tier's tensors; None: no swapping
        self.store_io: StoreBlockIO | None = None  # the shared KV store's block bytes; None: no store
        self.graphs = graphs  # decode steps that fit a captured bucket replay a CUDA graph
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = sampler or Sampler()
        self.verifier = Verifier(self.sampler)
        self.faults = faults  # tests only; None in production
        self.num_steps = 0
        self._generators: dict[str, torch.Generator | None] = {}
        # Penalised requests' token counts, kept step by step (engine/sampling/token_counts.py).
        self._counts: dict[str, TokenCounts] = {}

    def add_request(self, request_id: str, seed: int | None) -> None:
        """Build the request's sampling generator now, when it is added, not inside a step.

        A seed the generator refuses fails this request alone, with InvalidRequestError.
        """
        try:
            self._generators[request_id] = make_generator(seed, self.device)
        except (RuntimeError, OverflowError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"invalid seed {seed!r}: {exc}", "seed") from exc

    def generator_for(self, req: Request) -> torch.Generator | None:
        """The request's sampling generator (None when unseeded); a draft model draws from it too."""
        return self._generator(req)

    def _generator(self, req: Request) -> torch.Generator | None:
        if req.request_id not in self._generators:  # a request added without add_request (tests)
            self._generators[req.request_id] = make_generator(req.sampling_params.seed, self.device)
        return self._generators[req.request_id]

    def forget(self, request_ids: tuple[str, ...]) -> None:
        for rid in request_ids:
            self._generators.pop(rid, None)
            self._counts.pop(rid, None)

    def forget_all(self) -> None:
        """Drop every generator (the engine was reset)."""
        self._generators.clear()
        self._counts.clear()

    @staticmethod
    def _input_tokens(s: ScheduledRequest, req: Request) -> list[int]:
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_tokens
        num_prompt = req.num_prompt_tokens
        if end <= num_prompt:
            ids = req.prompt_token_ids[start:end]
        elif start >= num_prompt:
            ids = req.output_token_ids[start - num_prompt : end - num_prompt]
        else:
            ids = req.prompt_token_ids[start:] + req.output_token_ids[: end - num_prompt]
        if len(ids) != s.num_tokens:
            raise RuntimeError(f"request has {len(ids)} tokens to feed, the step says {s.num_tokens}")
        return ids

    def prepare(
        self, scheduled: Sequence[ScheduledRequest], inputs: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step (`inputs[i]`: the tokens `scheduled[i]` feeds) into input ids, positions
        and attention metadata. Returns also the flat index of the last token of each sampling
        sequence.
        """
        bs = self.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        max_blocks = max((len(s.block_ids) for s in scheduled), default=1)
        tables: list[list[int]] = []
        for s, ids_in in zip(scheduled, inputs, strict=True):
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_tokens
            token_ids.extend(ids_in)
            positions.extend(range(start, end))
            ids = s.block_ids
            slots.extend(ids[p // bs] * bs + p % bs for p in range(start, end))
            query_start.append(query_start[-1] + s.num_tokens)
            seq_lens.append(end)
            tables.append(list(ids) + [0] * (max_blocks - len(ids)))
            if s.samples:
                sample_rows.append(query_start[-1] - 1)
        dev = self.device
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            query_start_loc_cpu=tuple(query_start),
            seq_lens_cpu=tuple(seq_lens),
            max_query_len=max(s.num_tokens for s in scheduled),
            max_seq_len=max(seq_lens),
            block_size=bs,
        )
        input_ids = torch.tensor(token_ids, dtype=torch.int64, device=dev)  # [num_tokens]
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)  # [num_tokens]
        return input_ids, pos, metadata, sample_rows

    def copy_blocks(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write: duplicate source blocks into destination blocks, every layer."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]

    def transfer_blocks(self, out: SchedulerOutput) -> None:
        """The step's block copies in their order (engine/kv/kv_swap.py): swap-out, COW, swap-in."""
        swaps = out.swaps
        if swaps.has_swaps and self.host_kv is None:
            raise RuntimeError("the step swaps blocks but this runner has no host KV cache")
        if (swaps.store_out or swaps.store_in) and self.store_io is None:
            raise RuntimeError("the step moves blocks to or from the KV store but this runner has no store")
        if self.store_io is not None:
            self.store_io.save(swaps.store_out)  # before anything of this step writes a block
        if self.host_kv is not None:
            self.host_kv.swap_out(swaps.swap_out)
        self.copy_blocks(out.blocks_to_copy)
        if self.host_kv is not None:
            self.host_kv.swap_in(swaps.swap_in)
        if self.store_io is not None:
            self.store_io.load(swaps.store_in)

    @torch.inference_mode()
    def execute(
        self,
        out: SchedulerOutput,
        requests: Mapping[str, Request],
        drafts: Mapping[str, Draft] | None = None,
    ) -> StepResult:
        """Run one step: the sampled token of every request whose chunk reached its end.

        A failure in one request's own work leaves it out (`StepResult.failed`); a failure of the
        step as a whole (block copies, tensors, the forward) raises. A request with a draft
        (speculative decoding, within its `num_spec_slots`) feeds its draft tokens after its own
        and is verified over all of their rows (`StepResult.verified`); such steps have q_len > 1
        and so never replay a decode CUDA graph.
        """
        if self.threads is None or not out.scheduled:
            return self._execute(out, requests, drafts)
        self.threads.apply(out)
        start = time.perf_counter()
        result = self._execute(out, requests, drafts)
        self.threads.observe(out, time.perf_counter() - start)  # a step that raised is not timed
        return result

    def _execute(
        self,
        out: SchedulerOutput,
        requests: Mapping[str, Request],
        drafts: Mapping[str, Draft] | None,
    ) -> StepResult:
        """`execute` on the intra-op threads set for the step."""
        self.forget(out.finished_ids)  # a preempted request keeps its generator: seeds reproduce
        self.transfer_blocks(out)
        result = StepResult()
        if not out.scheduled:
            return result
        scheduled: list[ScheduledRequest] = []
        inputs: list[list[int]] = []
        fed: dict[str, Draft] = {}  # the drafts fed after their request's tokens, to verify
        for s in out.scheduled:
            try:
                ids = self._input_tokens(s, requests[s.request_id])
            except Exception as exc:  # this request's inputs are broken, not the step's
                logger.exception("preparing request %s failed", s.request_id)
                result.failed[s.request_id] = _describe(exc)
                continue
            draft = drafts.get(s.request_id) if drafts else None
            if draft is not None and 0 < len(draft.token_ids) <= s.num_spec_slots and s.samples:
                ids = ids + list(draft.token_ids)
                s = replace(s, num_tokens=s.num_tokens + len(draft.token_ids))
                fed[s.request_id] = draft
            inputs.append(ids)
            scheduled.append(s)
        if not scheduled:
            return result
        self.num_steps += 1
        if self.faults is not None:
            self.faults.before_forward(self.num_steps)
        scheduled, inputs, hidden, sample_rows = self._run_model(scheduled, inputs, requests)
        sampling: list[ScheduledRequest] = []
        rows: list[int] = []
        contexts: list[SamplingContext] = []
        spec_rows: list[int] = []  # rows of requests verifying drafts, each request's back to back
        spec: list[tuple[str, SamplingContext, Draft]] = []
        for s, row in zip([s for s in scheduled if s.samples], sample_rows, strict=True):
            try:
                context = self._context(requests[s.request_id])
            except Exception as exc:
                logger.exception("preparing the sampling of request %s failed", s.request_id)
                result.failed[s.request_id] = _describe(exc)
                continue
            draft = fed.get(s.request_id)
            if draft is not None:
                spec_rows.extend(range(row - len(draft.token_ids), row + 1))
                spec.append((s.request_id, context, draft))
                continue
            contexts.append(context)
            sampling.append(s)
            rows.append(row)
        if self.masks is not None and any(c.constraint is not None for c in contexts):
            sampling, rows, contexts = self._without_late_masks(sampling, rows, contexts, requests, result)
        if not sampling and not spec:
            return result
        index = torch.tensor(rows + spec_rows, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, index))  # type: ignore[operator]  # [num_rows, vocab]
        if sampling:
            self._sample(logits[: len(rows)], sampling, contexts, result)
        if spec:
            self._verify(logits[len(rows) :], spec, result)
        return result

    def _run_model(
        self,
        scheduled: list[ScheduledRequest],
        inputs: list[list[int]],
        requests: Mapping[str, Request],
    ) -> tuple[list[ScheduledRequest], list[list[int]], torch.Tensor, list[int]]:
        """The forward of the step: (its requests, their inputs, hidden [num_tokens, hidden], the
        sample rows), the requests reordered when the step needs more adapters than there are
        LoRA slots and so runs as several forwards, each with at most that many adapters."""
        if self.lora is None:
            hidden, sample_rows = self._forward(scheduled, inputs, None)
            return scheduled, inputs, hidden, sample_rows
        names = [_adapter_name(requests[s.request_id]) for s in scheduled]
        groups = self.lora.split(names)
        if len(groups) == 1:
            hidden, sample_rows = self._forward(scheduled, inputs, names)
            return scheduled, inputs, hidden, sample_rows
        order = [i for group in groups for i in group]
        hiddens: list[torch.Tensor] = []
        rows: list[int] = []
        offset = 0
        for group in groups:
            part, part_rows = self._forward(
                [scheduled[i] for i in group], [inputs[i] for i in group], [names[i] for i in group]
            )
            hiddens.append(part)
            rows.extend(offset + r for r in part_rows)
            offset += part.shape[0]
        return [scheduled[i] for i in order], [inputs[i] for i in order], torch.cat(hiddens), rows

    def _forward(
        self,
        scheduled: Sequence[ScheduledRequest],
        inputs: Sequence[Sequence[int]],
        adapters: Sequence[str | None] | None,
    ) -> tuple[torch.Tensor, list[int]]:
        input_ids, positions, metadata, sample_rows = self.prepare(scheduled, inputs)
        lora = None
        if self.lora is not None and adapters is not None:
            lora = self.lora.step(adapters, [len(ids) for ids in inputs])
        if lora is not None:  # never a CUDA graph: the graphs were captured without LoRA
            hidden = self.model(input_ids, positions, self.kv_caches, metadata, lora=lora)
            return hidden, sample_rows  # [num_tokens, hidden]
        bucket = self.graphs.bucket_for(metadata, input_ids.shape[0]) if self.graphs is not None else None
        if self.graphs is not None and bucket is not None:
            hidden = self.graphs.run(input_ids, positions, metadata, bucket)  # [num_tokens, hidden]
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, metadata)  # [num_tokens, hidden]
        return hidden, sample_rows

    def _verify(
        self, logits: torch.Tensor, spec: Sequence[tuple[str, SamplingContext, Draft]], result: StepResult
    ) -> None:
        """Verify the drafts (`logits` [sum(m + 1), vocab], in `spec` order); a failure fails
        only the requests of the drafts (all of them: their rows are verified together)."""
        try:
            verified = self.verifier.verify(logits, [c for _, c, _ in spec], [d for _, _, d in spec])
        except Exception as exc:
            logger.exception("verifying the drafts of %d requests failed", len(spec))
            for rid, _, _ in spec:
                result.failed[rid] = _describe(exc)
            return
        for (rid, _, _), v in zip(spec, verified, strict=True):
            result.verified[rid] = v
            result.sampled[rid] = v.sampled

    def _without_late_masks(
        self,
        sampling: list[ScheduledRequest],
        rows: list[int],
        contexts: list[SamplingContext],
        requests: Mapping[str, Request],
        result: StepResult,
    ) -> tuple[list[ScheduledRequest], list[int], list[SamplingContext]]:
        """The rows to sample, less those whose grammar mask is still computing after the
        prefetcher's grace wait: those sit the step out (`StepResult.sat_out`)."""
        masks = self.masks
        if masks is None:
            return sampling, rows, contexts
        late = {r.request_id for r in masks.wait_ready(requests[s.request_id] for s in sampling)}
        if not late:
            return sampling, rows, contexts
        result.sat_out.extend(late)
        keep = [i for i, s in enumerate(sampling) if s.request_id not in late]
        return [sampling[i] for i in keep], [rows[i] for i in keep], [contexts[i] for i in keep]

    def _context(self, req: Request) -> SamplingContext:
        if self.faults is not None:
            self.faults.before_sample(req.request_id)
        return SamplingContext(
            params=req.sampling_params,
            prompt_token_ids=req.prompt_token_ids,
            output_token_ids=req.output_token_ids,
            generator=self._generator(req),
            constraint=req.constraint,
            counts=self._token_counts(req),
        )

    def _token_counts(self, req: Request) -> TokenCounts | None:
        """The request's kept token counts when it has a penalty; None otherwise."""
        if not has_penalty(req.sampling_params):
            return None
        counts = self._counts.get(req.request_id)
        if counts is None:
            counts = self._counts[req.request_id] = TokenCounts(self.device)
        return counts

    def _sample(
        self,
        logits: torch.Tensor,
        sampling: Sequence[ScheduledRequest],
        contexts: Sequence[SamplingContext],
        result: StepResult,
    ) -> None:
        """Sample the batch at once; if that raises, row by row, so only the failing rows fail.

        Row by row, a seeded row still draws from its own generator, and a greedy row is still
        its argmax: the rows that succeed get the tokens they would have got in the batch
        (unless the batch raised after drawing from their generators).
        """
        try:
            samples = self.sampler(logits, contexts)  # logits: [num_sampling, vocab]
        except Exception:
            logger.exception("batched sampling failed; sampling its %d rows one by one", len(contexts))
        else:
            result.sampled.update((s.request_id, r) for s, r in zip(sampling, samples, strict=True))
            return
        for i, (s, context) in enumerate(zip(sampling, contexts, strict=True)):
            try:
                (sample,) = self.sampler(logits[i : i + 1], [context])  # [1, vocab]
            except Exception as exc:
                logger.exception("sampling request %s failed", s.request_id)
                result.failed[s.request_id] = _describe(exc)
                continue
            result.sampled[s.request_id] = sample
