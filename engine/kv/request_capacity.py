"""What of the KV pool one request may ever hold, and the requests refused because it cannot.

A sequence (a choice, a beam) may have to run alone, preempted and recomputed, so it must fit
the pool by itself less the admission watermark (`usable_blocks`); one that cannot would never
be admitted again. The context length is capped to that at start-up (`capped_max_model_len`),
and a request whose sequences, alone or as a group, can never fit is refused before it is
queued (`check_kv_capacity`, `KVCapacityError`). Plain Python, no torch.
"""

from __future__ import annotations

import logging

from weir.engine.errors import KVCapacityError
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import SamplingParams

logger = logging.getLogger("weir.engine")


def usable_blocks(kv: KVCacheManager) -> int:
    """The most blocks one sequence may ever hold: the pool less the admission watermark."""
    return kv.num_total_blocks - kv.watermark_blocks


def capped_max_model_len(kv: KVCacheManager, max_model_len: int) -> int:
    """`max_model_len`, capped to what one request can hold of the pool (with a warning: a request
    as long as the context could never be admitted, the context is the pool). Raises ValueError
    when the pool holds not even one token for one request."""
    capacity = usable_blocks(kv) * kv.block_size
    if capacity >= max_model_len:
        return max_model_len
    logger.warning(
        "the KV cache holds %d tokens for one request (%d blocks of %d, less the watermark), "
        "less than max_model_len %d: max_model_len is capped to %d",
        capacity,
        usable_blocks(kv),
        kv.block_size,
        max_model_len,
        capacity,
    )
    if capacity < 1:
        raise ValueError(f"the KV cache holds {capacity} tokens for one request; it needs at least 1")
    return capacity


def check_kv_capacity(kv: KVCacheManager, num_prompt: int, sp: SamplingParams) -> None:
    """Refuse (`KVCapacityError`) a request whose sequences, alone or together, can never fit the pool."""
    num_seqs = sp.beam_width if sp.use_beam_search else sp.n
    usable, block_size = usable_blocks(kv), kv.block_size
    # Each sequence (a choice, a beam) may have to run alone, preempted and recomputed,
    # so it must fit the pool by itself; if it cannot, it would never be admitted again.
    per_sequence = kv.blocks_for(num_prompt + sp.max_tokens)
    if per_sequence > usable:
        raise KVCapacityError(num_prompt, sp.max_tokens, num_seqs, per_sequence, usable, block_size)
    # The sequences of a group run together: the beams of a search advance in lockstep, the
    # choices fork from one prefill. Forks share the prompt's full blocks (copy-on-write);
    # the partial last block and every block of output are each sequence's own. A group
    # larger than the pool would be admitted, preempted and recomputed without end.
    shared = num_prompt // block_size
    needed = shared + num_seqs * (per_sequence - shared)
    if needed > usable:
        raise KVCapacityError(
            num_prompt,
            sp.max_tokens,
            num_seqs,
            needed,
            usable,
            block_size,
            param="beam_width" if sp.use_beam_search else "n",
        )
