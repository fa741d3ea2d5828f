"""weir.kernels.cpu_work_pool (native/work_pool.c): the C kernels on the pool's helper threads give the
bits they give on one thread or on OpenMP; the count is the calling thread's own; callers that
meet at the pool both get their answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.steps import random_step
from weir.kernels import cpu_decode_attention, cpu_small_gemm, cpu_work_pool, reference
from weir.kernels.cpu_small_gemm import MAX_ROWS, SmallGemm, panel_width

pytestmark = pytest.mark.skipif(
    not (cpu_work_pool.available() and cpu_small_gemm.available() and cpu_decode_attention.available()),
    reason="no C compiler here",
)


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    cpu_work_pool.set_pool_threads(0)


def _gemm_on(gemm: SmallGemm, x: torch.Tensor, torch_threads: int, pool: int) -> torch.Tensor:
    torch.set_num_threads(torch_threads)
    cpu_work_pool.set_pool_threads(pool)
    return gemm(x)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, MAX_ROWS),
    num_panels=st.integers(1, 600),
    ragged=st.integers(0, 7),
    in_features=st.integers(1, 200),
    pool=st.sampled_from([2, 3, 4]),
    seed=st.integers(0, 2**31 - 1),
)
def test_small_gemm_on_the_pool_gives_the_one_thread_bits(
    rows: int, num_panels: int, ragged: int, in_features: int, pool: int, seed: int
) -> None:
    out_features = max(1, num_panels * panel_width() - ragged)  # one panel to chunks of several
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    gemm = SmallGemm(weight)
    alone = _gemm_on(gemm, x, 1, 0)
    assert torch.equal(_gemm_on(gemm, x, 1, pool), alone)
    assert torch.equal(_gemm_on(gemm, x, pool, 0), alone)  # OpenMP, for comparison
    torch.testing.assert_close(alone, F.linear(x, weight), atol=1e-4 * in_features**0.5, rtol=1e-5)


def test_helpers_start_on_first_use_up_to_the_count_asked() -> None:
    gemm = SmallGemm(torch.randn(panel_width() * 64, 32))
    _gemm_on(gemm, torch.randn(4, 32), 1, 3)
    assert cpu_work_pool.num_helpers() >= 2


@pytest.mark.parametrize("pool", [2, 3])
def test_decode_attention_on_the_pool_gives_the_one_thread_bits(pool: int) -> None:
    step = random_step(
        [1] * 7,
        [0, 5, 15, 31, 64, 130, 300],
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        device=torch.device("cpu"),
        seed=pool,
    )
    reference.write_kv(step.key, step.value, step.kv_cache, step.metadata.slot_mapping)
    md = step.metadata
    plan = cpu_decode_attention.plan(md.block_tables, md.seq_lens_cpu, md.block_size)

    def attend(torch_threads: int, pool_threads: int) -> torch.Tensor:
        torch.set_num_threads(torch_threads)
        cpu_work_pool.set_pool_threads(pool_threads)
        return cpu_decode_attention.decode_attention(step.query, step.kv_cache, plan, 0.125)

    alone = attend(1, 0)
    assert torch.equal(attend(1, pool), alone)
    assert torch.equal(attend(pool, 0), alone)


def test_the_count_is_the_calling_threads_own() -> None:
    cpu_work_pool.set_pool_threads(2)
    seen: list[tuple[int, tuple[int, bool]]] = []
    other = threading.Thread(
        target=lambda: seen.append((cpu_work_pool.pool_threads(), cpu_work_pool.kernel_threads()))
    )
    other.start()
    other.join()
    assert seen == [(0, (torch.get_num_threads(), False))]
    assert cpu_work_pool.kernel_threads() == (2, True)
    cpu_work_pool.set_pool_threads(0)
    assert cpu_work_pool.kernel_threads() == (torch.get_num_threads(), False)
    with pytest.raises(ValueError, match=">= 0"):
        cpu_work_pool.set_pool_threads(-1)


def test_callers_that_meet_at_the_pool_both_get_their_answers() -> None:
    """Two engine threads at once: one uses the helpers, the other computes alone meanwhile."""
    gen = torch.Generator().manual_seed(7)
    gemms = [SmallGemm(torch.randn(panel_width() * 40 + 3, 96, generator=gen)) for _ in range(2)]
    xs = [torch.randn(MAX_ROWS, 96, generator=gen) for _ in range(2)]
    torch.set_num_threads(1)
    expected = [g(x) for g, x in zip(gemms, xs, strict=True)]
    failures: list[str] = []

    def caller(i: int) -> None:
        cpu_work_pool.set_pool_threads(2)
        for n in range(300):
            if not torch.equal(gemms[i](xs[i]), expected[i]):
                failures.append(f"caller {i}, call {n}")
                return

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and failures == []
