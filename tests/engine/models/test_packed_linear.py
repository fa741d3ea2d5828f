"""The CPU fast path (pre-packed oneDNN linear weights) against the plain `F.linear` path.

Per layer: PackedLinear equals F.linear within fp32 rounding at every row count. Per model:
the packed model gives the plain model's logits (fp32 tolerance) and the same greedy tokens on
prompt chunks, decode steps and a mixed step, on tiny random models and on SmolLM2. The engine
tests (tests/engine/test_llm_engine.py) run the packed path, the CPU default, against HF's
greedy `generate`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.engine.models.test_llama import Runner, _block_table, _prompt
from tests.engine.tiny_models import make_tiny_model
from weir.engine.config import EngineConfig
from weir.engine.models import packed_linear
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.llama import LlamaForCausalLM
from weir.engine.models.llama_layers import Linear
from weir.engine.models.packed_linear import (
    PackedLinear,
    cpu_packs_bfloat16,
    pack_linear_layers,
    packing_supported,
    packing_unsupported_reason,
)
from weir.engine.runner.loader import ModelLoadError, load_model
from weir.kernels import cpu_small_gemm

CPU = torch.device("cpu")
# Whether this CPU packs bfloat16 (AVX-512 or AMX): the engine's own probe decides every test below
# that depends on the CPU's instruction set, so they pass on an AVX2-only CPU too.
BF16_PACKING = cpu_packs_bfloat16()
pytestmark = pytest.mark.skipif(not packing_supported(torch.float32, CPU), reason="no oneDNN in this torch")

CASES = {
    "llama_gqa": {"num_kv_heads": 2},
    "llama_tied_biases": {"tie": True, "extra_config": {"attention_bias": True, "mlp_bias": True}},
    "qwen2": {"arch": "qwen2", "num_kv_heads": 2},
    "qwen3": {"arch": "qwen3", "num_kv_heads": 1, "head_dim": 32, "tie": True},
}


@pytest.mark.parametrize("rows", [1, 2, 7, 32, 129])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(rows: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    x = torch.randn(rows, 80, generator=gen)
    layer = PackedLinear(weight, b)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, weight, b), atol=1e-5, rtol=1e-5)
        # leading dimensions and a non-contiguous input (a column slice, like a split of qkv)
        wide = torch.randn(2, rows, 160, generator=gen)[..., ::2]
        torch.testing.assert_close(layer(wide), F.linear(wide, weight, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_the_c_kernel_copy_serves_inputs_up_to_row_inputs_and_equals_f_linear(bias: bool) -> None:
    if not cpu_small_gemm.available():
        pytest.skip("no C compiler: the C kernel is not built")
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 80, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    layer = PackedLinear(weight, b, row_inputs=3)
    assert layer.row_gemm is not None and layer.row_weight is None and layer.row_inputs == 3
    assert layer.row_weight_bytes == 96 * 80 * 4 and PackedLinear(weight, b).row_weight_bytes == 0
    assert PackedLinear(weight, b, row_inputs=100).row_inputs == cpu_small_gemm.MAX_ROWS
    packed_only = PackedLinear(weight, b)
    with torch.inference_mode():
        for rows in (1, 2, 3):
            x = torch.randn(rows, 80, generator=gen)
            torch.testing.assert_close(layer(x), F.linear(x, weight, b), atol=1e-5, rtol=1e-5)
            # up to row_inputs rows: the C kernel's product, bit for bit
            assert torch.equal(layer(x), layer.row_gemm(x))
        wide = torch.randn(1, 2, 160, generator=gen)[..., ::2]  # leading dims, non-contiguous
        torch.testing.assert_close(layer(wide), F.linear(wide, weight, b), atol=1e-5, rtol=1e-5)
        many = torch.randn(4, 80, generator=gen)  # more rows: the packed weight
        assert torch.equal(layer(many), packed_only(many))
        assert layer(torch.randn(0, 80)).shape == (0, 96)


@pytest.mark.parametrize("bias", [False, True])
def test_without_the_c_kernel_the_copy_is_transposed_and_serves_one_row(
    monkeypatch: pytest.MonkeyPatch, bias: bool
) -> None:
    monkeypatch.setattr(packed_linear, "row_copy_native", lambda: False)
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 80, generator=gen)
    b = torch.randn(96, generator=gen) if bias else None
    layer = PackedLinear(weight, b, row_inputs=4)
    assert layer.row_gemm is None and layer.row_inputs == 1
    assert layer.row_weight is not None and layer.row_weight.shape == (80, 96)
    assert layer.row_weight.is_contiguous() and layer.row_weight_bytes == 96 * 80 * 4
    with torch.inference_mode():
        for x in (torch.randn(1, 80, generator=gen), torch.randn(1, 1, 160, generator=gen)[..., ::2]):
            torch.testing.assert_close(layer(x), F.linear(x, weight, b), atol=1e-5, rtol=1e-5)
        # the one-row path is the transposed copy's product, bit for bit
        x = torch.randn(1, 80, generator=gen)
        expected = x @ layer.row_weight if b is None else torch.addmm(b, x, layer.row_weight)
        assert torch.equal(layer(x), expected)
        many = torch.randn(2, 80, generator=gen)  # more rows: the packed weight
        assert torch.equal(layer(many), PackedLinear(weight, b)(many))


def test_row_copies_are_float32_and_row_inputs_not_negative() -> None:
    with pytest.raises(ValueError, match="row_inputs"):
        PackedLinear(torch.zeros(4, 4), None, row_inputs=-1)
    if BF16_PACKING:
        with pytest.raises(ValueError, match="float32"):
            PackedLinear(torch.zeros(4, 4, dtype=torch.bfloat16), None, row_inputs=1)


def test_row_weights_need_the_packed_path_in_float32(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, num_kv_heads=2)
    with pytest.raises(ModelLoadError, match="row weights"):
        load_model(path, torch.float32, CPU, TorchAttentionBackend(), row_inputs=1)
    # bfloat16 row weights: refused for the dtype, or before that for the CPU that cannot pack it
    refusal = "row weights" if BF16_PACKING else "bfloat16 packing needs AVX-512"
    with pytest.raises(ModelLoadError, match=refusal):
        load_model(path, torch.bfloat16, CPU, TorchAttentionBackend(), pack_linear=True, row_inputs=1)
    with pytest.raises(ModelLoadError, match="row_inputs"):
        load_model(path, torch.float32, CPU, TorchAttentionBackend(), pack_linear=True, row_inputs=-1)
    for kwargs in ({"dtype": "bfloat16"}, {"device": "cuda"}, {"cpu_packed_linear": False}):
        with pytest.raises(ValueError, match="cpu_row_weights"):
            EngineConfig(model_path="m", cpu_row_weights=True, **kwargs)  # type: ignore[arg-type]
    EngineConfig(model_path="m", dtype="bfloat16", cpu_row_weights=False)  # off is always allowed
    model, config = load_model(
        path, torch.float32, CPU, TorchAttentionBackend(), pack_linear=True, row_inputs=2
    )
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(layers) == 4 * config.num_layers + 1 and all(m.row_weight_bytes > 0 for m in layers)
    assert {m.row_inputs for m in layers} == {2 if cpu_small_gemm.available() else 1}


@pytest.mark.skipif(not BF16_PACKING, reason="this CPU cannot pack bfloat16 (no AVX-512 or AMX)")
def test_packed_linear_bfloat16_tracks_f_linear() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 48, generator=gen).bfloat16()
    x = torch.randn(8, 48, generator=gen).bfloat16()
    out = PackedLinear(weight, None)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x, weight).float(), atol=5e-2, rtol=2e-2)


def test_packing_is_cpu_float32_or_bfloat16_only() -> None:
    assert not packing_supported(torch.float16, CPU)
    assert not packing_supported(torch.float32, torch.device("cuda"))
    assert packing_supported(torch.bfloat16, CPU) == BF16_PACKING
    assert packing_unsupported_reason(torch.float16, CPU) == (
        "pre-packed linear weights need float32 or bfloat16, not torch.float16"
    )
    assert packing_unsupported_reason(torch.float32, torch.device("cuda")) == (
        "pre-packed linear weights need a CPU, not cuda"
    )
    assert packing_unsupported_reason(torch.float32, CPU) is None
    with pytest.raises(ValueError, match="cannot pack"):
        PackedLinear(torch.zeros(4, 4, dtype=torch.float16), None)
    with pytest.raises(ValueError, match="cpu_packed_linear"):
        EngineConfig(model_path="m", dtype="float16", cpu_packed_linear=True)
    with pytest.raises(ValueError, match="cpu_packed_linear"):
        EngineConfig(model_path="m", device="cuda", cpu_packed_linear=True)
    EngineConfig(model_path="m", device="cuda", cpu_packed_linear=False)  # off is always allowed


def test_a_cpu_without_bfloat16_packing_is_told_which_instruction_set_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an AVX2-only CPU (e.g. a 2-core AMD EPYC without AVX-512), whatever CPU runs this test
    monkeypatch.setattr(packed_linear, "cpu_packs_bfloat16", lambda: False)
    assert not packing_supported(torch.bfloat16, CPU) and packing_supported(torch.float32, CPU)
    path = make_tiny_model(tmp_path, num_kv_heads=2)
    with pytest.raises(ModelLoadError) as refused:
        load_model(path, torch.bfloat16, CPU, TorchAttentionBackend(), pack_linear=True)
    message = str(refused.value)
    assert "bfloat16 packing needs AVX-512 (AVX512F, BW, VL and DQ) or AMX, which this CPU lacks" in message
    assert "need a CPU" not in message  # it is a CPU: the message must not contradict itself
    with pytest.raises(
        ValueError, match="cannot pack a torch.bfloat16 weight on cpu: bfloat16 packing needs"
    ):
        PackedLinear(torch.zeros(4, 4, dtype=torch.bfloat16), None)
    # the engine's default then leaves bfloat16 unpacked (and loads) instead of refusing to start
    from weir.engine import engine_builder

    assert not engine_builder._pack_linear(EngineConfig(model_path="m", dtype="bfloat16"))
    model, _ = load_model(path, torch.bfloat16, CPU, TorchAttentionBackend(), pack_linear=False)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert engine_builder._pack_linear(EngineConfig(model_path="m", dtype="float32"))


def test_packing_replaces_every_projection_and_refuses_reloading(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, num_kv_heads=2)
    with pytest.raises(ModelLoadError, match="pre-packed"):
        load_model(path, torch.float16, CPU, TorchAttentionBackend(), pack_linear=True)
    model, config = load_model(path, torch.float32, CPU, TorchAttentionBackend(), pack_linear=True)
    assert isinstance(model, LlamaForCausalLM) and model.is_packed
    assert not any(isinstance(m, Linear) for m in model.modules())
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 4 * config.num_layers + 1  # qkv, o, gate_up, down per layer, LM head
    assert pack_linear_layers(model, Linear) == 0
    with pytest.raises(ValueError, match="pack_linear_weights"):
        model.load_weights([("model.norm.weight", torch.ones(config.hidden_size))])


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp(request.param), **CASES[request.param])


def _both(path: Path, row_inputs: int = 0) -> tuple[Runner, Runner, int]:
    plain, config = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    packed, _ = load_model(
        path, torch.float32, CPU, TorchAttentionBackend(), pack_linear=True, row_inputs=row_inputs
    )
    assert isinstance(plain, LlamaForCausalLM) and isinstance(packed, LlamaForCausalLM)
    return Runner(plain, config), Runner(packed, config), config.vocab_size


def _assert_same(plain: list[torch.Tensor], packed: list[torch.Tensor], atol: float = 1e-5) -> None:
    for a, b in zip(plain, packed, strict=True):
        torch.testing.assert_close(b, a, atol=atol, rtol=1e-5)
        assert b.argmax(-1).tolist() == a.argmax(-1).tolist()


@pytest.mark.parametrize("row_inputs", [0, 1, 8])
def test_packed_model_equals_plain_model(tiny: Path, row_inputs: int) -> None:
    plain, packed, vocab = _both(tiny, row_inputs)
    prompts = [_prompt(s, n, vocab) for s, n in ((1, 23), (2, 9), (3, 14))]
    tables = [_block_table(i, len(p) + 4) for i, p in enumerate(prompts)]
    seq = list(prompts[0])
    for done in range(0, len(seq), 8):  # sequence 0: its prompt in chunks of 8
        chunk = seq[done : done + 8]
        last = packed.step([chunk], [tables[0]], [done])
        _assert_same(plain.step([chunk], [tables[0]], [done]), last)
    for _ in range(3):  # greedy decode steps
        seq.append(int(last[0][-1].argmax()))
        last = packed.step([seq[-1:]], [tables[0]], [len(seq) - 1])
        _assert_same(plain.step([seq[-1:]], [tables[0]], [len(seq) - 1]), last)
    # a mixed step: one decode row and two whole prompts
    seq.append(int(last[0][-1].argmax()))
    new = [seq[-1:], prompts[1], prompts[2]]
    _assert_same(
        plain.step(new, tables, [len(seq) - 1, 0, 0]), packed.step(new, tables, [len(seq) - 1, 0, 0])
    )


@pytest.mark.slow
@pytest.mark.parametrize("row_inputs", [0, cpu_small_gemm.MAX_ROWS])
def test_real_smollm2_packed_equals_plain(smollm2_dir: Path, row_inputs: int) -> None:
    """SmolLM2-135M in fp32: a 40-token prompt in chunks, then 8 greedy decode steps of 4 sequences
    (with `row_inputs`, on the row copies)."""
    plain, packed, vocab = _both(smollm2_dir, row_inputs)
    prompts = [_prompt(s, 40, vocab) for s in range(4)]
    tables = [_block_table(i, 48) for i in range(4)]
    last = packed.step(prompts, tables, [0] * 4)
    _assert_same(plain.step(prompts, tables, [0] * 4), last, atol=2e-3)
    seqs = [list(p) for p in prompts]
    for _ in range(8):
        for s, logits in zip(seqs, last, strict=True):
            s.append(int(logits[-1].argmax()))
        n = len(seqs[0])
        last = packed.step([s[-1:] for s in seqs], tables, [n - 1] * 4)
        _assert_same(plain.step([s[-1:] for s in seqs], tables, [n - 1] * 4), last, atol=2e-3)
