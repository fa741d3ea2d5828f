"""weir_bench.flops: the model's GEMM shapes and the measured GEMM peak the roofline bound uses."""

from __future__ import annotations

from tests.bench.test_offline import MODEL
from weir_bench.flops import measure_peak_gemm_flops, model_gemm_shapes


def test_the_model_shapes_are_its_projections_for_a_step_of_rows() -> None:
    h, i = MODEL.hidden_size, MODEL.intermediate_size
    q, kv = MODEL.num_heads * MODEL.head_dim, MODEL.num_kv_heads * MODEL.head_dim
    assert model_gemm_shapes(MODEL, rows=64) == [(64, h, q + 2 * kv), (64, q, h), (64, h, 2 * i), (64, i, h)]


def test_the_peak_is_the_best_of_every_shape_and_is_timed_for_a_while() -> None:
    square = measure_peak_gemm_flops(size=64, repeats=1, min_s=0.05)
    both = measure_peak_gemm_flops(size=64, repeats=1, min_s=0.05, shapes=[(128, 128, 128)])
    assert square > 0 and both > 0
    # a larger matmul in the lot can only raise the best, up to timing noise between two calls
    assert both >= 0.5 * square
