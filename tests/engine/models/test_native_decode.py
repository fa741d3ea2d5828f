"""weir.engine.models.native_decode: a decode step's layers in one C call give the layer-by-layer path's
bits on every model it is built for, take only the steps within their reach, and are not built
where they do not apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.models.test_llama import CASES, Runner, _block_table, _prompt, _steps_with
from tests.engine.tiny_models import make_tiny_model
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.llama import LlamaForCausalLM
from weir.engine.models.native_decode import NativeDecodeLayers
from weir.engine.runner.loader import load_model
from weir.kernels import cpu_decode_layers

CPU = torch.device("cpu")

pytestmark = pytest.mark.skipif(
    not cpu_decode_layers.available(), reason="no C compiler: the C decode layers are not built"
)


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = make_tiny_model(tmp_path_factory.mktemp(request.param), **CASES[request.param])
    return path, request.param


def _packed(path: Path, row_inputs: int = 8) -> LlamaForCausalLM:
    model, _ = load_model(path, torch.float32, CPU, TorchAttentionBackend())
    assert isinstance(model, LlamaForCausalLM)
    model.pack_linear_weights(row_inputs)
    return model


def test_the_same_bits_as_layer_by_layer_on_every_model(tiny: tuple[Path, str]) -> None:
    """Prompt chunks, a mixed step, decode steps of two rows and one: with the switch on the
    decode steps take the C driver, and every logit and so every cache entry the later steps read
    is the same bit as with it off. Models with per-head q/k norms (Qwen3) do not get it."""
    path, name = tiny
    model = _packed(path)
    native = model.native_decode
    if model.config.qk_norm:
        assert native is None and not model.native_ops.decode_layers
        return
    assert native is not None and model.native_ops.decode_layers and native.max_rows == 8
    seqs = [_prompt(11, 22, model.config.vocab_size), _prompt(12, 10, model.config.vocab_size)]
    results = {}
    for on in (True, False):
        model.native_ops.decode_layers = on
        before = native.steps_taken
        results[on] = _steps_with(model, model.config, seqs)
        assert native.steps_taken - before == (2 if on else 0), name  # the two decode steps only
    for a, b in zip(results[True], results[False], strict=True):
        assert torch.equal(a, b), name


def _llama(tmp_path: Path) -> Path:
    return make_tiny_model(tmp_path, num_kv_heads=2)


def _decode_step(model: LlamaForCausalLM, rows: int) -> None:
    """Prefill `rows` sequences in one step, then one decode step of all of them."""
    runner = Runner(model, model.config)
    seqs = [_prompt(20 + i, 5, model.config.vocab_size) for i in range(rows)]
    tables = [_block_table(i, 8) for i in range(rows)]
    runner.step(seqs, tables, [0] * rows)
    runner.step([[3]] * rows, tables, [5] * rows)


def test_steps_past_the_linears_reach_take_the_layers_one_by_one(tmp_path: Path) -> None:
    model = _packed(_llama(tmp_path), row_inputs=2)
    native = model.native_decode
    assert native is not None and native.max_rows == 2
    _decode_step(model, 3)  # a prompt step and a 3-row decode step: neither within reach
    assert native.steps_taken == 0
    _decode_step(model, 2)
    assert native.steps_taken == 1


def test_any_switch_off_keeps_the_layers_one_by_one(tmp_path: Path) -> None:
    model = _packed(_llama(tmp_path))
    native = model.native_decode
    assert native is not None
    for switch in ("rope_kv", "silu_mul", "norms"):
        setattr(model.native_ops, switch, False)
        _decode_step(model, 2)
        setattr(model.native_ops, switch, True)
    model.fused_ops = False  # no step-wide RoPE tables
    _decode_step(model, 2)
    model.fused_ops = True
    native.backend.native_decode = False  # the torch decode attention (the A/B's switch)
    _decode_step(model, 2)
    assert native.steps_taken == 0
    native.backend.native_decode = True
    _decode_step(model, 2)
    assert native.steps_taken == 1


def test_not_built_without_row_kernels_or_in_half_precision(tmp_path: Path) -> None:
    path = _llama(tmp_path)
    model = _packed(path, row_inputs=0)  # packed for oneDNN only
    assert model.native_decode is None and not model.native_ops.decode_layers
    plain, _ = load_model(path, torch.float32, CPU, TorchAttentionBackend())  # not packed at all
    assert isinstance(plain, LlamaForCausalLM) and plain.native_decode is None
    half, _ = load_model(path, torch.bfloat16, CPU, TorchAttentionBackend())
    assert isinstance(half, LlamaForCausalLM)
    assert NativeDecodeLayers.build(half.layers, half.norm, half.config, half.dtype, half.native_ops) is None
