"""Top-k, top-p and min-p over a batch of temperature-scaled logits: the tokens each row's
distribution excludes, set to -inf (engine/sampling/sampler.py draws from what is left).

Cost on CPU decides the shape: a full sort of a 50k vocabulary costs tens of milliseconds for a
batch, more than a small model's forward pass. So top-k and top-p look at the `topk` candidates
only (top-p falls back to a full sort for the rare rows whose nucleus is wider than
`TOP_P_CANDIDATES`), and min-p is a comparison in logit space.

Filters keep ties: top-k keeps every token whose logit equals the k-th largest, top-p keeps every
token whose probability equals the smallest one kept. The result is a pure function of the row.
Torch on tensors, no request state; on float32 CPU logits top-p's normaliser is one C pass
(kernels/cpu_sample.py `logsumexp_rows`).
"""

from __future__ import annotations

import torch

from weir.kernels import cpu_sample

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


def _logsumexp_above(logits: torch.Tensor, kth: torch.Tensor) -> torch.Tensor:  # [rows, 1]
    """log-sum-exp of each row over the logits at or above its `kth` ([rows, 1]; -inf: all)."""
    if logits.is_cpu and logits.dtype == torch.float32 and cpu_sample.available():
        return cpu_sample.logsumexp_rows(logits, kth[:, 0].contiguous())[:, None]
    return logits.masked_fill(logits < kth, float("-inf")).logsumexp(dim=-1, keepdim=True)


def filter_floors(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    num_top_p_candidates: int = TOP_P_CANDIDATES,
) -> torch.Tensor | None:  # [rows, 1]
    """Each row's smallest kept logit under top-k, top-p and min-p (-inf where a row keeps all),
    or None when no row filters: `apply_filters` masks exactly the logits below it, and the
    sampler's C draw gives them no weight.

    `logits` is [rows, vocab] (already divided by temperature); `top_k` [rows] long with the
    vocabulary size meaning disabled; `top_p` and `min_p` [rows] float. Ties are kept.
    """
    vocab_size = logits.shape[-1]
    neg_inf = float("-inf")
    uses_top_k = top_k < vocab_size  # [rows]
    uses_top_p = top_p < 1.0  # [rows]
    uses_min_p = min_p > 0.0  # [rows]
    any_top_k, any_top_p, any_min_p = bool(uses_top_k.any()), bool(uses_top_p.any()), bool(uses_min_p.any())
    if not (any_top_k or any_top_p or any_min_p):
        return None
    floor = torch.full((logits.shape[0], 1), neg_inf, dtype=logits.dtype, device=logits.device)
    if any_top_k or any_top_p:
        # The batch's candidates: the top-p window, or the largest k within it. A row whose k is
        # wider (a client may ask for any k up to the vocabulary) finds its k-th alone: one
        # tenant's top_k must not make every row of the step sort its whole vocabulary.
        max_k = int(top_k[uses_top_k].max()) if any_top_k else 1
        num_candidates = min(
            vocab_size, num_top_p_candidates if any_top_p else min(max_k, num_top_p_candidates)
        )
        candidates = logits.topk(num_candidates, dim=-1).values  # [rows, C], best first
        kth = candidates.gather(1, (top_k.clamp(max=num_candidates) - 1)[:, None])  # [rows, 1]
        wide = uses_top_k & (top_k > num_candidates)  # [rows]
        if bool(wide.any()):
            for row in wide.nonzero()[:, 0].tolist():  # the k-th largest: the (vocab - k + 1)-th smallest
                kth[row, 0] = logits[row].kthvalue(vocab_size - int(top_k[row]) + 1).values
        floor = kth.masked_fill(~uses_top_k[:, None], neg_inf)
        if any_top_p:
            candidates = candidates.masked_fill(candidates < floor, neg_inf)
            log_norm = _logsumexp_above(logits, floor)  # [rows, 1]: over what top-k keeps
            threshold = _nucleus_threshold(candidates, log_norm, top_p)  # [rows, 1]
            # Where top-k keeps more than the candidates, a nucleus that reaches the last
            # candidate may extend past it.
            unresolved = uses_top_p & (top_k > num_candidates) & (threshold[:, 0] <= candidates[:, -1])
            if num_candidates < vocab_size and bool(unresolved.any()):
                rows = unresolved.nonzero()[:, 0]
                full = logits[rows].sort(dim=-1, descending=True).values  # [unresolved, vocab]
                full = full.masked_fill(full < floor[rows], neg_inf)  # what top-k keeps
                threshold[rows] = _nucleus_threshold(full, log_norm[rows], top_p[rows])
            floor = torch.maximum(floor, threshold.masked_fill(~uses_top_p[:, None], neg_inf))
    if any_min_p:
        # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p), with no softmax needed;
        # renormalisation after top-k / top-p does not change the ratio to the max probability,
        # which they always keep (log 0 = -inf: no floor for a row without min-p).
        floor = torch.maximum(floor, logits.max(dim=-1, keepdim=True).values + min_p[:, None].log())
    return floor


def apply_filters(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    num_top_p_candidates: int = TOP_P_CANDIDATES,
) -> torch.Tensor:
    """Mask (set to -inf) the tokens that top-k, top-p and min-p exclude, row by row: the logits
    below `filter_floors` (same arguments); `logits` itself when no row filters."""
    floor = filter_floors(logits, top_k, top_p, min_p, num_top_p_candidates)
    return logits if floor is None else logits.masked_fill(logits < floor, float("-inf"))
