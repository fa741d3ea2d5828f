"""Verification of draft tokens against the target's distributions, exactly.

A request with m draft tokens d_1..d_m gets m + 1 rows of target logits: row i holds the
logits after the sequence extended by d_1..d_i. Row i's distribution p_i is what the `Sampler`
would sample from there (penalties and logit bias counted over the extended output, then
temperature, top-k, top-p, min-p), read from `Sampler.distribution`.

- Greedy rows: the sampler's own greedy token t_i per row; drafts are accepted while
  d_{i+1} == t_i, and the first t_i that differs (or t_m, the bonus) is emitted after them. So
  the tokens are exactly those of decoding one at a time.
- Sampled rows (the rejection rule, Leviathan et al. 2023 / Chen et al. 2023): d_{i+1} was
  drawn from q_i; it is accepted with probability min(1, p_i(d) / q_i(d)). At the first rejection
  a token is drawn from norm(max(0, p_i - q_i)) and the step ends; if all m are accepted, a bonus
  token is drawn from p_m. The emitted tokens are distributed exactly as p's, whatever q is.
  For the n-gram drafter q_i is a point mass on d_{i+1}: accept with p_i(d), else draw from p_i
  with d removed.

Each request draws its uniform numbers from its own generator when seeded (the shared one
otherwise), in a fixed order: one per draft tested, one per token drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from weir.engine.sampling.sampler import Sampler, SampleResult, SamplingContext, samples_greedily


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for one request, with the distribution each was drawn from.

    `probs` is [len(token_ids), vocab] (row i: the q that token i was drawn from), or None when
    each token is a point mass (q(token) = 1), as for the n-gram drafter and greedy requests.
    """

    token_ids: tuple[int, ...]
    probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} draft tokens but {self.probs.shape[0]} q rows")


# accept(p(d), q(d), u) with u uniform in [0, 1): whether the draft token d is kept.
AcceptRule = Callable[[float, float, float], bool]


def exact_accept(p: float, q: float, u: float) -> bool:
    """The rejection rule: accept with probability min(1, p / q)."""
    return u * q < p


@dataclass(frozen=True)
class Verification:
    """One request's verified step: the accepted drafts, then the token sampled after them."""

    num_drafted: int
    accepted: tuple[SampleResult, ...]
    sampled: SampleResult  # the correction at the first rejection, or the bonus token


def extended_contexts(context: SamplingContext, draft: Sequence[int]) -> list[SamplingContext]:
    """Row i's context: the request's output extended by the first i draft tokens (m + 1 rows)."""
    output = list(context.output_token_ids)
    # Each row's output differs: its counts come from its own list, not the sequence's kept ones.
    return [
        replace(context, output_token_ids=output + list(draft[:i]), counts=None)
        for i in range(len(draft) + 1)
    ]


class Verifier:
    """Turns target logits of draft rows into accepted tokens; `accept` is the acceptance rule
    (tests swap in a wrong one to show the distribution test notices)."""

    def __init__(self, sampler: Sampler, accept: AcceptRule = exact_accept) -> None:
        self.sampler = sampler
        self.accept = accept

    def verify(
        self,
        logits: torch.Tensor,
        contexts: Sequence[SamplingContext],
        drafts: Sequence[Draft],
    ) -> list[Verification]:
        """`logits` [sum(m_r + 1), vocab]: each request's m_r + 1 rows back to back, in order."""
        rows: list[SamplingContext] = []
        for context, draft in zip(contexts, drafts, strict=True):
            rows.extend(extended_contexts(context, draft.token_ids))
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} draft rows")
        probs = self.sampler.distribution(logits, rows)  # [rows, vocab]
        results: list[Verification] = []
        start = 0
        for context, draft in zip(contexts, drafts, strict=True):
            num = len(draft.token_ids) + 1
            span = slice(start, start + num)
            tokens = self._tokens(probs[span], rows[span], draft, context)
            logprobs = Sampler.logprobs(
                logits[span][: len(tokens)],
                torch.tensor(tokens, device=logits.device),
                rows[span][: len(tokens)],
            )
            samples = [SampleResult(t, lp) for t, lp in zip(tokens, logprobs, strict=True)]
            results.append(Verification(len(draft.token_ids), tuple(samples[:-1]), samples[-1]))
            start += num
        return results

    def _tokens(
        self, probs: torch.Tensor, rows: Sequence[SamplingContext], draft: Draft, context: SamplingContext
    ) -> list[int]:
        """The emitted tokens: accepted drafts, then one sampled token. `probs` [m + 1, vocab]."""
        if samples_greedily(context.params):
            targets = probs.argmax(dim=-1).tolist()  # [m + 1]: each greedy row is a point mass
            out: list[int] = []
            for d, t in zip(draft.token_ids, targets, strict=False):
                if d != t:
                    break
                out.append(d)
            return [*out, targets[len(out)]]
        out = []
        for i, d in enumerate(draft.token_ids):
            p = probs[i]  # [vocab]
            q_d = 1.0 if draft.probs is None else float(draft.probs[i, d])
            u = float(self.sampler.uniform([context], probs.device)[0, 0])
            if self.accept(float(p[d]), q_d, u):
                out.append(d)
                continue
            if draft.probs is None:
                residual = p.clone()
                residual[d] = 0.0
            else:
                residual = (p - draft.probs[i].to(p.dtype)).clamp_(min=0.0)
            if float(residual.sum()) <= 0.0:
                residual = p  # only when p == q, where a rejection has probability 0
            token = int(self.sampler.draw(residual[None, :], [rows[i]])[0])
            return [*out, token]
        bonus = int(self.sampler.draw(probs[len(out)][None, :], [rows[len(out)]])[0])
        return [*out, bonus]
