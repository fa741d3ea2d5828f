"""Turns a SchedulerOutput into tensors, runs the model, and samples.

The runner owns the KV cache tensors and the per-request sampling generators. It knows
nothing about queues or policies: it executes exactly the step it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from engine.attention import AttentionMetadata
from engine.cuda_graphs import DecodeGraphs
from engine.output import SchedulerOutput
from engine.request import Request
from engine.sampler import Sampler, SampleResult, SamplingContext, make_generator


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
    ) -> None:
        self.model = model
        self.graphs = graphs  # decode steps that fit a captured bucket replay a CUDA graph
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = sampler or Sampler()
        self._generators: dict[str, torch.Generator | None] = {}

    def _generator(self, req: Request) -> torch.Generator | None:
        if req.request_id not in self._generators:
            self._generators[req.request_id] = make_generator(req.sampling_params.seed, self.device)
        return self._generators[req.request_id]

    def forget(self, request_ids: tuple[str, ...]) -> None:
        for rid in request_ids:
            self._generators.pop(rid, None)

    def prepare(
        self, out: SchedulerOutput, requests: Mapping[str, Request]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step into input ids, positions and attention metadata.

        Returns also the flat index of the last token of each sampling sequence.
        """
        bs = self.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        max_blocks = max((len(s.block_ids) for s in out.scheduled), default=1)
        tables: list[list[int]] = []
        for s in out.scheduled:
            req = requests[s.request_id]
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_tokens
            num_prompt = req.num_prompt_tokens
            if end <= num_prompt:
                token_ids.extend(req.prompt_token_ids[start:end])
            elif start >= num_prompt:
                token_ids.extend(req.output_token_ids[start - num_prompt : end - num_prompt])
            else:
                token_ids.extend(req.prompt_token_ids[start:])
                token_ids.extend(req.output_token_ids[: end - num_prompt])
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
            max_query_len=max(s.num_tokens for s in out.scheduled),
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

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> dict[str, SampleResult]:
        """Run one step; returns the sampled token of every request whose chunk reached its end."""
        self.forget(out.finished_ids)  # a preempted request keeps its generator: seeds reproduce
        self.copy_blocks(out.blocks_to_copy)
        if not out.scheduled:
            return {}
        input_ids, positions, metadata, sample_rows = self.prepare(out, requests)
        bucket = self.graphs.bucket_for(metadata, input_ids.shape[0]) if self.graphs is not None else None
        if self.graphs is not None and bucket is not None:
            hidden = self.graphs.run(input_ids, positions, metadata, bucket)  # [num_tokens, hidden]
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, metadata)  # [num_tokens, hidden]
        sampling = [s for s in out.scheduled if s.samples]
        if not sampling:
            return {}
        rows = torch.tensor(sample_rows, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))  # type: ignore[operator]  # [num_sampling, vocab]
        contexts = []
        for s in sampling:
            req = requests[s.request_id]
            contexts.append(
                SamplingContext(
                    params=req.sampling_params,
                    prompt_token_ids=req.prompt_token_ids,
                    output_token_ids=req.output_token_ids,
                    generator=self._generator(req),
                )
            )
        results = self.sampler(logits, contexts)
        return {s.request_id: r for s, r in zip(sampling, results, strict=True)}
