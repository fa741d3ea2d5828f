"""Draft-model drafting: a small model sharing the target's tokenizer proposes k tokens.

The draft model has KV tensors of its own, shaped like the target's pool (same number of blocks,
same block size), and writes them through the target's block tables: a request's draft KV lives
in the same block ids as its target KV, so allocation, truncation and freeing are the scheduler's
one accounting, and rolled-back slots are rolled back for both. Copy-on-write pairs of the step
are applied to the draft tensors too.

Per request it remembers how far its draft KV holds real tokens; each step it first feeds the
tokens it has not seen (the whole prompt the first time, then the last sampled token and any
accepted drafts it did not write itself), then one token per further draft, batched over the
requests still drafting. After a preemption, or when the blocks it wrote through changed (a swap
to the host tier and back, a copy-on-write), it starts again from 0.
The first forward of a step feeds at most `max_feed_tokens` tokens over all requests (the
scheduler's chunk): a request further behind (a long prompt) is fed a chunk without drafting and
drafts once caught up, so one long prompt never stalls a step the scheduler sized.
Draft KV that went stale in a shared or copied block can only lower the acceptance rate: the
target verifies every token, so the output never depends on the draft's correctness.

Greedy requests draft the draft model's argmax (a point mass). Sampled requests draft from
q = the draft's distribution under the request's own sampling parameters (`Sampler.distribution`),
drawn with the request's generator, and hand q to the verifier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from weir.engine.output import ScheduledRequest, SchedulerOutput
from weir.engine.request import Request
from weir.engine.runner.runner import ModelRunner
from weir.engine.sampling.draft_verifier import Draft
from weir.engine.sampling.sampler import Sampler, SamplingContext, samples_greedily


@dataclass
class _DraftKV:
    """How far one request's draft KV holds its real tokens."""

    num_preemptions: int  # the request's count when this was recorded: a change means new blocks
    num_valid: int  # positions [0, num_valid) hold the request's real tokens
    base: int  # position of the first token proposed last time
    fed: tuple[int, ...]  # proposed tokens the draft wrote KV for, from `base` on
    block_ids: tuple[int, ...]  # the block table it wrote through


@dataclass
class _Row:
    """One request drafting this step."""

    request: Request
    scheduled: ScheduledRequest
    num_wanted: int
    context: SamplingContext
    tokens: list[int]
    probs: list[torch.Tensor]


def _fed_tokens(req: Request, step: ScheduledRequest) -> list[int]:
    """The tokens of `req` that `step` feeds."""
    start = step.num_computed_tokens
    return req.all_token_ids[start : start + step.num_tokens]


class DraftModelDrafter:
    """A `Drafter` running a small model on its own KV tensors and the target's block tables.

    `draft` executes the draft model (its own weights and KV tensors); `target` lends each
    request's sampling generator, so a seeded request's drafts are reproducible too.
    """

    def __init__(
        self,
        draft: ModelRunner,
        target: ModelRunner,
        sampler: Sampler | None = None,
        max_feed_tokens: int = 2048,
    ) -> None:
        if max_feed_tokens < 1:
            raise ValueError(f"max_feed_tokens must be >= 1, got {max_feed_tokens}")
        self.draft = draft
        self.target = target
        self.sampler = sampler or target.sampler
        self.max_feed_tokens = max_feed_tokens
        self._kv: dict[str, _DraftKV] = {}

    def forget_all(self) -> None:
        self._kv.clear()

    def _num_valid(self, req: Request, block_ids: tuple[int, ...]) -> int:
        """Positions of `req` whose draft KV holds its real tokens now (`block_ids`: its table)."""
        st = self._kv.get(req.request_id)
        if st is None or st.num_preemptions != req.num_preemptions:
            return 0
        matched = 0
        for i, token in enumerate(st.fed):
            pos = st.base + i
            if pos >= req.num_tokens or req.token_at(pos) != token:
                break
            matched += 1
        valid = min(st.num_valid + matched, req.num_tokens - 1)
        bs = self.draft.block_size
        num_blocks = -(-valid // bs)
        if block_ids[:num_blocks] != st.block_ids[:num_blocks]:
            return 0
        return valid

    @torch.inference_mode()
    def propose(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> dict[str, Draft]:
        self.draft.copy_blocks(out.blocks_to_copy)
        for rid in out.finished_ids:
            self._kv.pop(rid, None)
        rows: list[_Row] = []
        inputs: list[list[int]] = []
        steps: list[ScheduledRequest] = []
        wanted: list[tuple[int, int, Request, ScheduledRequest]] = []  # (tokens behind, first one, ...)
        for s in out.scheduled:
            req = requests.get(s.request_id)
            if req is not None and s.num_spec_slots:
                start = self._num_valid(req, s.block_ids)
                wanted.append((req.num_tokens - start, start, req, s))
        # Fewest behind first: a request that drafted last step is one or two tokens behind, so
        # another's catch-up never costs it its drafts.
        wanted.sort(key=lambda w: w[0])
        left = self.max_feed_tokens
        catch_up: tuple[Request, ScheduledRequest] | None = None  # fed only: too far behind to draft
        for behind, start, req, s in wanted:
            if behind > left:  # so are the rest: the first is fed what is left, without drafting
                if left:
                    catch_up = (req, ScheduledRequest(s.request_id, left, start, s.block_ids, False))
                break
            left -= behind
            context = SamplingContext(
                req.sampling_params,
                req.prompt_token_ids,
                req.output_token_ids,
                self.target.generator_for(req),
            )
            rows.append(_Row(req, s, s.num_spec_slots, context, [], []))
            steps.append(ScheduledRequest(s.request_id, behind, start, s.block_ids, True))
            inputs.append(_fed_tokens(req, steps[-1]))
        if catch_up is not None:
            steps.append(catch_up[1])
            inputs.append(_fed_tokens(*catch_up))
        self._forward(rows, steps, inputs)
        if catch_up is not None:
            late, c = catch_up
            end = c.num_computed_tokens + c.num_tokens
            self._kv[late.request_id] = _DraftKV(late.num_preemptions, end, end, (), c.block_ids)
        if not rows:
            return {}
        for _ in range(max(r.num_wanted for r in rows) - 1):
            live = [r for r in rows if len(r.tokens) < r.num_wanted]
            steps = [
                ScheduledRequest(
                    r.scheduled.request_id,
                    1,
                    r.request.num_tokens + len(r.tokens) - 1,
                    r.scheduled.block_ids,
                    True,
                )
                for r in live
            ]
            self._forward(live, steps, [[r.tokens[-1]] for r in live])
        drafts: dict[str, Draft] = {}
        for r in rows:
            req = r.request
            self._kv[req.request_id] = _DraftKV(
                req.num_preemptions,
                req.num_tokens,
                req.num_tokens,
                tuple(r.tokens[:-1]),
                r.scheduled.block_ids,
            )
            greedy = samples_greedily(req.sampling_params)
            drafts[req.request_id] = Draft(tuple(r.tokens), None if greedy else torch.stack(r.probs))
        return drafts

    def _forward(
        self, rows: Sequence[_Row], steps: Sequence[ScheduledRequest], inputs: Sequence[Sequence[int]]
    ) -> None:
        """One draft forward over `steps` (those of `rows` first, then any that only feed KV): each
        row gets its next draft token (and its q row)."""
        if not steps:
            return
        runner = self.draft
        input_ids, positions, metadata, sample_rows = runner.prepare(steps, inputs)
        hidden = runner.model(input_ids, positions, runner.kv_caches, metadata)  # [num_tokens, hidden]
        if not rows:
            return
        index = torch.tensor(sample_rows, dtype=torch.int64, device=runner.device)
        logits = runner.model.compute_logits(hidden.index_select(0, index)).float()  # type: ignore[operator]  # [rows, vocab]
        contexts = [
            SamplingContext(
                r.context.params,
                r.context.prompt_token_ids,
                [*r.context.output_token_ids, *r.tokens],
                r.context.generator,
            )
            for r in rows
        ]
        probs = self.sampler.distribution(logits, contexts)  # [rows, vocab]
        for i, (r, context) in enumerate(zip(rows, contexts, strict=True)):
            if samples_greedily(context.params):
                r.tokens.append(int(probs[i].argmax()))
            else:
                r.tokens.append(int(self.sampler.draw(probs[i : i + 1], [context])[0]))
                r.probs.append(probs[i])
