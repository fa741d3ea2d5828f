"""weir_bench.arrivals: schedules of the open-loop modes."""

from __future__ import annotations

import pytest

from weir_bench.arrivals import ArrivalMode, ArrivalSpec, send_offsets
from weir_bench.workloads import RequestKind, WorkloadRequest


def reqs(times: list[float]) -> list[WorkloadRequest]:
    return [
        WorkloadRequest(id=str(i), t=t, tenant="a", kind=RequestKind.COMPLETION, max_tokens=1, prompt="p")
        for i, t in enumerate(times)
    ]


def test_trace_times_are_scaled() -> None:
    assert send_offsets(reqs([0.0, 1.0, 3.0]), ArrivalSpec(rate_scale=2.0)) == [0.0, 0.5, 1.5]
    assert ArrivalSpec(rate_scale=2.0).describe() == {"mode": "trace", "rate_scale": 2.0}


def test_poisson_is_seeded_and_has_the_rate() -> None:
    spec = ArrivalSpec(mode=ArrivalMode.POISSON, rate=50.0, seed=7)
    a = send_offsets(reqs([0.0] * 2000), spec)
    assert a == send_offsets(reqs([0.0] * 2000), spec)
    assert a == sorted(a) and 0.9 * 50.0 < len(a) / a[-1] < 1.1 * 50.0
    assert a != send_offsets(reqs([0.0] * 2000), ArrivalSpec(mode=ArrivalMode.POISSON, rate=50.0, seed=8))


def test_concurrency_has_no_schedule() -> None:
    spec = ArrivalSpec(mode=ArrivalMode.CONCURRENCY, concurrency=4)
    assert send_offsets(reqs([5.0, 9.0]), spec) == [0.0, 0.0]
    assert spec.describe() == {"mode": "concurrency", "concurrency": 4}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate_scale": 0.0}, "rate_scale"),
        ({"mode": ArrivalMode.POISSON}, "rate"),
        ({"mode": ArrivalMode.CONCURRENCY, "concurrency": 0}, "concurrency"),
    ],
)
def test_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ArrivalSpec(**kwargs)
