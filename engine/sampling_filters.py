"""Top-k, top-p and min-p over a batch of temperature-scaled logits: the tokens each row's
distribution excludes, set to -inf (engine/sampler.py draws from what is left).

Cost on CPU decides the shape: a full sort of a 50k vocabulary costs tens of milliseconds for a
batch, more than a small model's forward pass. So top-k and top-p look at the `topk` candidates
only (top-p falls back to a full sort for the rare rows whose nucleus is wider than
`TOP_P_CANDIDATES`), and min-p is a comparison in logit space.

Filters keep ties: top-k keeps every token whose logit equals the k-th largest, top-p keeps every
token whose probability equals the smallest one kept. The result is a pure function of the row.
Plain torch on tensors; no request state.
"""

from __future__ import annotations

import torch

# Top-p looks for its nucleus among this many best tokens before sorting the whole vocabulary.
TOP_P_CANDIDATES = 1024


def _nucleus_threshold(
    sorted_logits: torch.Tensor, log_norm: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The smallest logit top-p keeps, per row ([rows, 1]), from logits sorted best first.

    `sorted_logits` [rows, C] may be the C best of the row only; `log_norm` [rows, 1] is the
    log-sum-exp of the whole row, so probabilities are those of the whole vocabulary.
    """
    probs = (sorted_logits - log_norm).exp()  # [rows, C]
    # A token is kept when the mass of the tokens strictly before it is below top_p.
    mass_before = probs.cumsum(dim=-1) - probs
    num_kept = (mass_before < top_p[:, None]).sum(dim=-1).clamp(min=1)  # [rows]
    return sorted_logits.gather(1, (num_kept - 1)[:, None])


def apply_filters(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    num_top_p_candidates: int = TOP_P_CANDIDATES,
) -> torch.Tensor:
    """Mask (set to -inf) the tokens that top-k, top-p and min-p exclude, row by row.

    `logits` is [rows, vocab] (already divided by temperature); `top_k` [rows] long with the
    vocabulary size meaning disabled; `top_p` and `min_p` [rows] float. Ties are kept.
    """
    vocab_size = logits.shape[-1]
    neg_inf = float("-inf")
    uses_top_k = top_k < vocab_size  # [rows]
    uses_top_p = top_p < 1.0  # [rows]
    any_top_k, any_top_p = bool(uses_top_k.any()), bool(uses_top_p.any())
    if any_top_k or any_top_p:
        max_k = int(top_k[uses_top_k].max()) if any_top_k else 1
        num_candidates = min(vocab_size, max(max_k, num_top_p_candidates if any_top_p else 1))
        candidates = logits.topk(num_candidates, dim=-1).values  # [rows, C], best first
        kth = candidates.gather(1, (top_k.clamp(max=num_candidates) - 1)[:, None])  # [rows, 1]
        kth = kth.masked_fill(~uses_top_k[:, None], neg_inf)
        logits = logits.masked_fill(logits < kth, neg_inf)
        if any_top_p:
            candidates = candidates.masked_fill(candidates < kth, neg_inf)
            log_norm = logits.logsumexp(dim=-1, keepdim=True)  # [rows, 1]
            threshold = _nucleus_threshold(candidates, log_norm, top_p)  # [rows, 1]
            # Without top-k, a nucleus that reaches the last candidate may extend past it.
            unresolved = uses_top_p & ~uses_top_k & (threshold[:, 0] <= candidates[:, -1])
            if num_candidates < vocab_size and bool(unresolved.any()):
                rows = unresolved.nonzero()[:, 0]
                full = logits[rows].sort(dim=-1, descending=True).values  # [unresolved, vocab]
                threshold[rows] = _nucleus_threshold(full, log_norm[rows], top_p[rows])
            threshold = threshold.masked_fill(~uses_top_p[:, None], neg_inf)
            logits = logits.masked_fill(logits < threshold, neg_inf)
    if bool((min_p > 0.0).any()):
        # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p), with no softmax needed;
        # renormalisation after top-k / top-p does not change the ratio to the max probability.
        floor = logits.max(dim=-1, keepdim=True).values + min_p[:, None].log()  # [rows, 1]
        logits = logits.masked_fill(logits < floor, neg_inf)
    return logits
