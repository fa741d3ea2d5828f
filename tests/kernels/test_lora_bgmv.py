"""weir.kernels.lora_bgmv against a torch reference: each token through its own slot, base tokens none."""

from __future__ import annotations

import pytest
import torch

from weir.kernels.lora_bgmv import bgmv_expand_, bgmv_shrink

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}
SLOTS = [2, -1, 0, 1, 1, -1, 0, 2, 2]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("in_features", "width"), [(40, 12), (576, 48)])
def test_shrink_matches_a_per_token_reference(
    device: torch.device, dtype: torch.dtype, in_features: int, width: int
) -> None:
    x = torch.randn(len(SLOTS), in_features, generator=_gen())
    a = torch.randn(3 * width, in_features, generator=_gen()) / in_features**0.5
    slots = torch.tensor(SLOTS)
    expected = torch.zeros(len(SLOTS), width)
    for i, s in enumerate(SLOTS):
        if s >= 0:
            expected[i] = x[i] @ a[s * width : (s + 1) * width].t()
    got = bgmv_shrink(x.to(device, dtype), a.to(device, dtype), slots.to(device), width)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.float().cpu(), expected, atol=atol * 10, rtol=rtol * 10)
    assert not got[torch.tensor(SLOTS) < 0].any()  # base tokens: exact zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("rank", "out"), [(4, 24), (16, 200)])
def test_expand_adds_each_tokens_own_slot_into_a_column_slice(
    device: torch.device, dtype: torch.dtype, rank: int, out: int
) -> None:
    t = torch.randn(len(SLOTS), rank, generator=_gen())
    b = torch.randn(3 * rank, out, generator=_gen()) / rank**0.5
    wide = torch.randn(len(SLOTS), out + 10, generator=_gen())
    expected = wide.clone()
    for i, s in enumerate(SLOTS):
        if s >= 0:
            expected[i, 5 : 5 + out] += t[i] @ b[s * rank : (s + 1) * rank]
    y = wide.to(device, dtype)
    before = y.clone()
    bgmv_expand_(
        y[:, 5 : 5 + out], t.to(device, dtype), b.to(device, dtype), torch.tensor(SLOTS, device=device)
    )
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.float().cpu(), expected.to(dtype).float(), atol=atol * 10, rtol=rtol * 10)
    base = torch.tensor(SLOTS, device=device) < 0
    assert torch.equal(y[base], before[base])  # base rows untouched
    assert torch.equal(y[:, :5], before[:, :5]) and torch.equal(y[:, 5 + out :], before[:, 5 + out :])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda d: bgmv_shrink(
                torch.randn(2, 8, device=d),
                torch.randn(6, 8, device=d),
                torch.zeros(2, dtype=torch.long, device=d),
                4,
            ),
            "width must be",
        ),
        (
            lambda d: bgmv_shrink(
                torch.randn(2, 8, device=d),
                torch.randn(6, 7, device=d),
                torch.zeros(2, dtype=torch.long, device=d),
                3,
            ),
            "a has size 7",
        ),
        (
            lambda d: bgmv_shrink(
                torch.randn(2, 8, device=d),
                torch.randn(6, 8, device=d),
                torch.zeros(3, dtype=torch.long, device=d),
                3,
            ),
            "token_slots has size 3",
        ),
        (
            lambda d: bgmv_shrink(
                torch.randn(2, 8, device=d), torch.randn(6, 8, device=d), torch.zeros(2, device=d), 3
            ),
            "token_slots must have dtype",
        ),
        (
            lambda d: bgmv_expand_(
                torch.randn(2, 8, device=d),
                torch.randn(2, 3, device=d),
                torch.randn(7, 8, device=d),
                torch.zeros(2, dtype=torch.long, device=d),
            ),
            "must divide b's 7 rows",
        ),
        (
            lambda d: bgmv_expand_(
                torch.randn(2, 8, device=d),
                torch.randn(2, 3, device=d),
                torch.randn(6, 9, device=d),
                torch.zeros(2, dtype=torch.long, device=d),
            ),
            "b has size 9",
        ),
    ],
)
def test_rejects_bad_arguments_naming_them(device: torch.device, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call(device)
