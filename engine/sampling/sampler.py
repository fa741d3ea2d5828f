"""Logits -> token ids: greedy, temperature, top-k / top-p / min-p, penalties, logit bias, seeds, logprobs.

One `Sampler` call handles a whole batch. The work is split by what each row needs:

- rows that are greedy with no penalty cost one `argmax` over the batch (the CPU hot path);
- rows with a repetition / presence / frequency penalty or a logit bias get their logits adjusted
  first, batched over those rows only (the bias is added last, so -100 bans a token, greedy or not);
- rows that sample are scaled by temperature, filtered (top-k, then top-p over what top-k kept,
  then min-p) and drawn by inverting the cumulative distribution with one uniform number per
  row. A seeded row draws its number from its own generator, so its tokens do not depend on which
  other rows share the batch or in which order.

Cost on CPU decides the shape: 50k exponential draws per row cost tens of milliseconds for a
batch, more than a small model's forward pass, so the draw is a cumulative sum and a search (one
C kernel on float32 CPU logits, kernels/cpu_sample.py). The filters are
engine/sampling/sampling_filters.py (top-k and top-p over the `topk` candidates, min-p in logit space).

A row with a constraint (`weir.engine.structured.constraints`: JSON Schema, regex, grammar, tool calls) has the
tokens its grammar does not admit masked to -inf after penalties and logit bias and before
temperature and the filters, so no bias or sampling setting can pick a token the grammar refuses.

Logprobs are those of the model: `log_softmax` of the raw logits, before penalties, the
constraint's mask, temperature and filters, like the OpenAI API reports them (so a constrained
row's top alternatives may name tokens the grammar did not allow). A temperature below `_MIN_TEMPERATURE` is greedy,
because dividing by it would overflow float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from weir.engine.output import TokenLogprob
from weir.engine.request import SamplingParams
from weir.engine.sampling.sampling_filters import apply_filters, filter_floors
from weir.engine.sampling.token_counts import TokenCounts
from weir.engine.structured.constraints import TokenConstraint, allowed_tokens
from weir.kernels import cpu_argmax, cpu_sample

# Below this temperature, logits / temperature can overflow float32; such rows are greedy.
_MIN_TEMPERATURE = 1e-5


@dataclass
class SamplingContext:
    """One row of the batch: how to sample it and what the request has seen so far."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None  # per-request, seeded; None when params.seed is None
    # The sequence's grammar matcher (structured outputs, tool calls); None: unconstrained.
    constraint: TokenConstraint | None = None
    # Its token counts kept step by step (penalties); None: counted from the token lists here.
    counts: TokenCounts | None = None


@dataclass(frozen=True)
class SampleResult:
    """The token chosen for one row, with its logprob when the request asked for them."""

    token_id: int
    logprob: TokenLogprob | None


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator seeded for one request on `device`, or None when the request has no seed."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _is_greedy(params: SamplingParams) -> bool:
    return params.is_greedy or params.temperature < _MIN_TEMPERATURE


def samples_greedily(params: SamplingParams) -> bool:
    """Whether the sampler takes the argmax for a row with these parameters."""
    return _is_greedy(params)


def _filters(params: SamplingParams) -> bool:
    """Whether top-k, top-p or min-p excludes tokens of this row's distribution."""
    return params.top_k >= 0 or params.top_p < 1.0 or params.min_p > 0.0


def has_penalty(params: SamplingParams) -> bool:
    """Whether a row with these parameters has a repetition, presence or frequency penalty."""
    return (
        params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    )


def _adjusts_logits(params: SamplingParams) -> bool:
    return has_penalty(params) or bool(params.logit_bias)


def _token_counts(rows: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """How many times each token occurs in each row, as a [len(rows), vocab_size] float tensor."""
    width = max((len(r) for r in rows), default=0)
    counts = torch.zeros(len(rows), vocab_size + 1, dtype=torch.float32, device=device)
    if width == 0:
        return counts[:, :vocab_size]
    # Pad with an extra bin (index vocab_size) that is dropped afterwards; ids the logits do not
    # cover (a tokenizer larger than the model's head) land there too.
    padded = [list(r) + [vocab_size] * (width - len(r)) for r in rows]
    ids = torch.tensor(padded, dtype=torch.long, device=device).clamp_(max=vocab_size)  # [rows, width]
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def _prompt_counts(
    contexts: Sequence[SamplingContext], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """`_token_counts` of each row's prompt, each prompt list counted once: a verify step's rows of
    one request share its prompt, which may be the longest sequence of the batch."""
    first: dict[int, int] = {}  # id of a prompt list -> its row among the distinct ones
    rows = [first.setdefault(id(c.prompt_token_ids), len(first)) for c in contexts]
    distinct = list({id(c.prompt_token_ids): c.prompt_token_ids for c in contexts}.values())
    counts = _token_counts(distinct, vocab_size, device)  # [len(distinct), vocab]
    return counts if len(distinct) == len(contexts) else counts[torch.tensor(rows, device=device)]


def apply_penalties(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
    """Return penalised copies of `logits` rows ([len(contexts), vocab]), one row per context.

    Repetition penalty (Hugging Face semantics): every token seen in prompt or output has its
    logit divided by the penalty when positive and multiplied by it when negative.
    Presence / frequency penalties (OpenAI semantics), over output tokens only:
    `logit -= frequency_penalty * count + presence_penalty * (count > 0)`.
    """
    vocab_size = logits.shape[-1]
    device = logits.device
    out = logits.clone()  # [rows, vocab]
    rep = torch.tensor([c.params.repetition_penalty for c in contexts], dtype=logits.dtype, device=device)
    kept = [c.counts for c in contexts if c.counts is not None]
    if len(kept) == len(contexts):  # each row's counts kept step by step: no recount of long sequences
        output_counts = torch.stack(
            [k.output(c.output_token_ids, vocab_size) for k, c in zip(kept, contexts, strict=True)]
        )  # [rows, vocab]
    else:
        output_counts = _token_counts(
            [c.output_token_ids for c in contexts], vocab_size, device
        )  # [rows, vocab]
    if bool((rep != 1.0).any()):
        if len(kept) == len(contexts):
            prompt_counts = torch.stack(
                [k.prompt(c.prompt_token_ids, vocab_size) for k, c in zip(kept, contexts, strict=True)]
            )  # [rows, vocab]
        else:
            prompt_counts = _prompt_counts(contexts, vocab_size, device)
        seen = (prompt_counts + output_counts) > 0  # [rows, vocab]
        penalised = torch.where(out > 0, out / rep[:, None], out * rep[:, None])
        out = torch.where(seen, penalised, out)
    freq = torch.tensor([c.params.frequency_penalty for c in contexts], dtype=logits.dtype, device=device)
    pres = torch.tensor([c.params.presence_penalty for c in contexts], dtype=logits.dtype, device=device)
    out -= freq[:, None] * output_counts + pres[:, None] * (output_counts > 0).to(logits.dtype)
    return out


def apply_logit_bias(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
    """Add each row's `logit_bias` to its logits in place ([len(contexts), vocab]) and return them.

    Token ids beyond the logits (the model's vocabulary) are ignored, as OpenAI ignores unknown ids.
    """
    vocab_size = logits.shape[-1]
    rows, ids, biases = [], [], []
    for row, context in enumerate(contexts):
        for token_id, bias in context.params.logit_bias:
            if token_id < vocab_size:
                rows.append(row)
                ids.append(token_id)
                biases.append(bias)
    if rows:
        index = (torch.tensor(rows, device=logits.device), torch.tensor(ids, device=logits.device))
        logits.index_put_(
            index, torch.tensor(biases, dtype=logits.dtype, device=logits.device), accumulate=True
        )
    return logits


def _adjust(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
    """Penalised and biased copies of `logits` rows ([len(contexts), vocab])."""
    if any(has_penalty(c.params) for c in contexts):
        out = apply_penalties(logits, contexts)
    else:
        out = logits.clone()
    return apply_logit_bias(out, contexts)


def _masked(work: torch.Tensor, logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
    """`work` ([N, vocab]) with each constrained row's refused tokens at -inf; `work` is copied
    first when it is still the caller's `logits`. Raises ConstraintError if a grammar admits no
    token (the runner then samples row by row, so only that row fails)."""
    rows = [i for i, c in enumerate(contexts) if c.constraint is not None]
    if not rows:
        return work
    constraints = [c.constraint for c in contexts if c.constraint is not None]
    allowed = allowed_tokens(constraints, work.shape[-1], work.device)  # [rows, vocab]
    if work is logits:
        work = logits.clone()
    index = torch.tensor(rows, device=work.device)
    work[index] = work[index].masked_fill(~allowed, float("-inf"))
    return work


class Sampler:
    """Chooses the next token of every row of a batch of logits.

    `seed` seeds the shared generator used by rows without a per-request generator; the default
    seeds it from the operating system. Generators are created lazily, one per device.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._generators[device] = generator
        return generator

    def __call__(self, logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> list[SampleResult]:
        """Sample one token per row. `logits` is [N, vocab] float32; row i belongs to contexts[i]."""
        if logits.dim() != 2 or logits.shape[0] != len(contexts):
            raise ValueError(f"logits must be [{len(contexts)}, vocab], got {tuple(logits.shape)}")
        if not contexts:
            return []
        sample_rows = [i for i, c in enumerate(contexts) if not _is_greedy(c.params)]
        work = self._adjusted(logits, contexts)
        if len(sample_rows) == len(contexts):
            token_ids = self._sample(work, contexts)  # [N]; no greedy row, no gather/scatter
        else:
            # One argmax for the whole batch; sampled rows overwrite their entry.
            token_ids = _argmax_rows(work)  # [N]
            if sample_rows:
                index = torch.tensor(sample_rows, device=logits.device)
                token_ids[index] = self._sample(work[index], [contexts[i] for i in sample_rows])

        ids = token_ids.tolist()
        logprobs = self.logprobs(logits, token_ids, contexts)
        return [SampleResult(token_id=ids[i], logprob=logprobs[i]) for i in range(len(contexts))]

    @staticmethod
    def _adjusted(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        """`logits` with penalties and logit bias applied to the rows that have them, then the
        tokens each constrained row's grammar refuses masked to -inf ([N, vocab])."""
        penalty_rows = [i for i, c in enumerate(contexts) if _adjusts_logits(c.params)]
        if len(penalty_rows) == len(contexts):
            work = _adjust(logits, contexts)
        elif not penalty_rows:
            work = logits
        else:
            index = torch.tensor(penalty_rows, device=logits.device)
            work = logits.clone()
            work[index] = _adjust(logits[index], [contexts[i] for i in penalty_rows])
        return _masked(work, logits, contexts)

    def distribution(self, logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        """The exact distribution `__call__` draws each row from ([N, vocab], rows sum to 1).

        Penalties, logit bias, temperature, top-k, top-p and min-p are applied as when sampling;
        a greedy row is a point mass on its argmax. Speculative verification reads p (and a
        draft model's q) from here, so it tests drafts against what sampling would have done.
        """
        if logits.dim() != 2 or logits.shape[0] != len(contexts):
            raise ValueError(f"logits must be [{len(contexts)}, vocab], got {tuple(logits.shape)}")
        work = self._adjusted(logits, contexts)
        probs = torch.zeros_like(work, dtype=torch.float32)  # [N, vocab]
        greedy = [i for i, c in enumerate(contexts) if _is_greedy(c.params)]
        sampled = [i for i, c in enumerate(contexts) if not _is_greedy(c.params)]
        if greedy:
            index = torch.tensor(greedy, device=logits.device)
            probs[index, work[index].argmax(dim=-1)] = 1.0
        if sampled:
            index = torch.tensor(sampled, device=logits.device)
            probs[index] = self._filtered_probs(work[index], [contexts[i] for i in sampled]).float()
        return probs

    @staticmethod
    def _temperatures(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        return torch.tensor(
            [c.params.temperature for c in contexts], dtype=logits.dtype, device=logits.device
        )

    @staticmethod
    def _filter_params(
        logits: torch.Tensor, contexts: Sequence[SamplingContext]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's top-k (the vocabulary size: off), top-p and min-p, as `filter_floors` reads them."""
        device = logits.device
        vocab_size = logits.shape[-1]
        top_k = torch.tensor(
            [vocab_size if c.params.top_k < 0 else min(c.params.top_k, vocab_size) for c in contexts],
            dtype=torch.long,
            device=device,
        )
        top_p = torch.tensor([c.params.top_p for c in contexts], dtype=logits.dtype, device=device)
        min_p = torch.tensor([c.params.min_p for c in contexts], dtype=logits.dtype, device=device)
        return top_k, top_p, min_p

    @staticmethod
    def _filtered(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        """Temperature, then top-k / top-p / min-p, row by row: the logits whose softmax each row
        draws from, excluded tokens at -inf ([rows, vocab])."""
        scaled = logits / Sampler._temperatures(logits, contexts)[:, None]  # [rows, vocab]
        return apply_filters(scaled, *Sampler._filter_params(logits, contexts))

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        """Temperature, then top-k / top-p / min-p, then softmax, row by row ([rows, vocab])."""
        return Sampler._filtered(logits, contexts).softmax(dim=-1)  # [rows, vocab]

    def uniform(self, contexts: Sequence[SamplingContext], device: torch.device) -> torch.Tensor:
        """One uniform number in [0, 1) per row ([rows, 1]): a seeded row's from its own generator."""
        uniform = torch.rand(len(contexts), 1, generator=self._shared_generator(device), device=device)
        for row, context in enumerate(contexts):
            if context.generator is not None:
                uniform[row] = torch.rand(1, generator=context.generator, device=device)
        return uniform

    def draw(self, probs: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        """One token per row of `probs` [rows, vocab] (rows need not be normalised), by inverting
        the cumulative distribution with `uniform`'s numbers. Returns [rows] long."""
        vocab_size = probs.shape[-1]
        uniform = self.uniform(contexts, probs.device)  # [rows, 1]
        cdf = probs.cumsum(dim=-1)  # [rows, vocab]
        # The first index whose cumulative mass exceeds u: an excluded token adds no mass, so it
        # can never be that index.
        token_ids = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).clamp_(max=vocab_size - 1)
        # u * total can round up to the total itself; fall back to the most likely token then.
        chosen_prob = probs.gather(1, token_ids)  # [rows, 1]
        return torch.where(chosen_prob > 0, token_ids, probs.argmax(dim=-1, keepdim=True))[:, 0]

    def _sample(self, logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> torch.Tensor:
        """Draw one token per row of `logits` [rows, vocab] from its filtered distribution. On
        float32 CPU logits the C kernel draws (kernels/cpu_sample.py: the softmax, the cumulative
        sum and the draw in two passes, against torch's four, ~2 ms a step at 8 rows of a
        49,152-token vocabulary), with the same uniform numbers as `draw`."""
        if not (logits.is_cpu and logits.dtype == torch.float32 and cpu_sample.available()):
            return self.draw(self._filtered_probs(logits, contexts), contexts)
        uniform = self.uniform(contexts, logits.device)[:, 0]  # [rows]
        temperatures = self._temperatures(logits, contexts)
        if not any(_filters(c.params) for c in contexts):
            return cpu_sample.sample_rows(logits, temperatures, uniform)
        # The filters' floors on the scaled logits, as `_filtered` masks them; the kernel gives
        # the logits below them no weight instead of a masked copy of the rows.
        scaled = logits / temperatures[:, None]  # [rows, vocab]
        floor = filter_floors(scaled, *self._filter_params(logits, contexts))
        ones = torch.ones(len(contexts), dtype=torch.float32)
        return cpu_sample.sample_rows(scaled, ones, uniform, None if floor is None else floor[:, 0])

    @staticmethod
    def logprobs(
        logits: torch.Tensor, token_ids: torch.Tensor, contexts: Sequence[SamplingContext]
    ) -> list[TokenLogprob | None]:
        """Model logprobs of the chosen tokens and top alternatives, for rows that asked."""
        result: list[TokenLogprob | None] = [None] * len(contexts)
        rows = [i for i, c in enumerate(contexts) if c.params.logprobs is not None]
        if not rows:
            return result
        index = torch.tensor(rows, device=logits.device)
        log_probs = logits[index].float().log_softmax(dim=-1)  # [rows, vocab]
        chosen = log_probs.gather(1, token_ids[index][:, None]).squeeze(1).tolist()  # [rows]
        num_top = max(contexts[i].params.logprobs or 0 for i in rows)
        top_values: list[list[float]] = [[] for _ in rows]
        top_ids: list[list[int]] = [[] for _ in rows]
        if num_top > 0:
            top = log_probs.topk(min(num_top, log_probs.shape[-1]), dim=-1)  # sorted, best first
            top_values, top_ids = top.values.tolist(), top.indices.tolist()
        ids = token_ids[index].tolist()
        for j, i in enumerate(rows):
            n = contexts[i].params.logprobs or 0
            alternatives = tuple(zip(top_ids[j][:n], top_values[j][:n], strict=True))
            result[i] = TokenLogprob(token_id=ids[j], logprob=chosen[j], top=alternatives)
        return result


def _argmax_rows(work: torch.Tensor) -> torch.Tensor:  # [N, vocab] -> [N] int64
    """`work.argmax(dim=-1)`; on float32 CPU logits the C kernel (kernels/cpu_argmax.py: torch's
    walks a row one value at a time, 0.6 ms a step at 8 rows of a 49,152-token vocabulary)."""
    if work.is_cpu and work.dtype == torch.float32 and cpu_argmax.available():
        return cpu_argmax.argmax_rows(work)
    return work.argmax(dim=-1)
