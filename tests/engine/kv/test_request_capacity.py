"""What of the KV pool one request may hold: the context cap, and requests that can never fit."""

from __future__ import annotations

import pytest

from weir.engine.errors import KVCapacityError
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.kv.request_capacity import capped_max_model_len, check_kv_capacity, usable_blocks
from weir.engine.request import SamplingParams


def _kv(num_blocks: int, watermark: float = 0.1) -> KVCacheManager:
    return KVCacheManager(
        num_blocks=num_blocks, block_size=4, root_digest=lambda *_: b"r" * 32, watermark=watermark
    )


def test_one_request_may_hold_the_pool_less_the_watermark() -> None:
    kv = _kv(20)
    assert usable_blocks(kv) == kv.num_total_blocks - kv.watermark_blocks == 17
    assert capped_max_model_len(kv, 64) == 64
    assert capped_max_model_len(kv, 1024) == 68  # the context is the pool


def test_a_pool_without_a_token_for_one_request_is_refused() -> None:
    with pytest.raises(ValueError, match="needs at least 1"):
        capped_max_model_len(_kv(4, watermark=1.0), 16)  # all watermark


def test_a_sequence_or_a_group_that_can_never_fit_is_refused() -> None:
    kv = _kv(20)  # 17 usable blocks of 4 tokens
    check_kv_capacity(kv, 8, SamplingParams(max_tokens=60))  # 17 blocks: fits alone
    with pytest.raises(KVCapacityError) as alone:
        check_kv_capacity(kv, 8, SamplingParams(max_tokens=61))
    assert alone.value.param == "max_tokens"
    # Two choices share the prompt's 2 full blocks and need 4 of their own each: 10.
    check_kv_capacity(kv, 8, SamplingParams(max_tokens=16, n=2))
    with pytest.raises(KVCapacityError) as group:
        check_kv_capacity(kv, 8, SamplingParams(max_tokens=16, n=5))  # 2 + 5 * 4 = 22
    assert group.value.param == "n"
