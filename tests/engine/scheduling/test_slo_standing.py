"""engine/scheduling/slo_standing.py: a request stands while its first token and every gap kept their targets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from weir.engine.latency_targets import LatencyTargets
from weir.engine.request import Request, SamplingParams
from weir.engine.scheduling.slo_standing import ITL_TOLERANCE, SloStanding


def _req(rid: str = "r", ttft_s: float | None = 2.0, itl_s: float | None = 0.1) -> Request:
    req = Request(rid, [1, 2, 3], SamplingParams(max_tokens=64), arrival_s=0.0)
    req.latency = LatencyTargets(ttft_s, itl_s)
    return req


def _token(req: Request, at: float) -> None:
    if req.times.first_token_s is None:
        req.times.first_token_s = at
    req.times.token_s.append(at)


def test_a_request_stands_while_both_targets_hold() -> None:
    standing, req = SloStanding(), _req()
    assert standing.stands(req)  # no token yet: nothing missed
    for k in range(10):
        _token(req, 1.0 + 0.1 * k)
        assert standing.stands(req)


def test_a_late_first_token_loses_it() -> None:
    standing, req = SloStanding(), _req()
    _token(req, 2.5)
    assert not standing.stands(req)


def test_one_long_gap_loses_it_for_good() -> None:
    standing, req = SloStanding(), _req()
    _token(req, 1.0)
    _token(req, 1.0 + 0.1 * (1 + ITL_TOLERANCE) * 1.01)
    assert not standing.stands(req)
    for k in range(5):  # short gaps after it do not bring it back
        _token(req, 2.0 + 0.05 * k)
        assert not standing.stands(req)


def test_a_gap_within_the_tolerance_is_kept() -> None:
    standing, req = SloStanding(), _req()
    _token(req, 1.0)
    _token(req, 1.0 + 0.1 * (1 + ITL_TOLERANCE) * 0.99)
    assert standing.stands(req)


def test_without_targets_it_always_stands() -> None:
    standing, req = SloStanding(), _req(ttft_s=None, itl_s=None)
    _token(req, 100.0)
    _token(req, 200.0)
    assert standing.stands(req)


@given(st.lists(st.floats(min_value=0.001, max_value=0.3), min_size=1, max_size=50))
def test_standing_is_exactly_every_gap_within_the_bound(gaps: list[float]) -> None:
    standing, req = SloStanding(), _req()
    now = 1.0
    _token(req, now)
    for gap in gaps:  # checked after each token: incremental checks see every gap once
        now += gap
        _token(req, now)
        standing.stands(req)
    times = req.times.token_s
    expected = all(b - a <= 0.1 * (1 + ITL_TOLERANCE) for a, b in zip(times, times[1:], strict=False))
    assert standing.stands(req) is expected


def test_finished_requests_are_forgotten() -> None:
    standing = SloStanding()
    for i in range(200):
        standing.stands(_req(f"r{i}"))
    standing.retain({"r199"})
    assert len(standing) == 1
