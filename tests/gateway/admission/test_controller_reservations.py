"""Admission reservations: settlement refunds, beam search and defaulted max_tokens (issue 10,
defects 4 and 8), overshoot as debt, and the default reservation's settings."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.gateway.admission_doubles import (
    Setup,
    admit,
    make_setup,
    record,
    request,
    sample,
    stats,
    tenant,
)
from weir.engine.client import EngineRequest
from weir.engine.request import SamplingParams
from weir.gateway.admission.accounting import Outcome, Usage
from weir.gateway.admission.controller import AdmissionConfig
from weir.gateway.admission.request_tokens import num_reserved_tokens
from weir.gateway.http.errors import BadRequestError, RateLimitError
from weir.tenancy.context import TenantContext


@pytest.fixture
def setup() -> Setup:
    return make_setup()


# -- settlement ----------------------------------------------------------------------------------


def test_settlement_refunds_the_unused_reservation(setup: Setup) -> None:
    acme = tenant(tokens_per_minute=1_000)
    req = request(10, 90, n=2)
    assert num_reserved_tokens([req]) == 190
    admitted = admit(setup, acme, req)
    bucket = setup.budget.allowance("acme", acme.quota).bucket
    assert bucket is not None and bucket.level(setup.clock.now) == 810
    admitted.settle(record(acme, 10, 30))
    assert bucket.level(setup.clock.now) == 960  # 40 used, 150 back
    admitted.settle(record(acme, 10, 30))  # exactly once
    assert bucket.level(setup.clock.now) == 960
    assert sample(setup, "weir_admission_reserved_tokens_total", tenant="acme") == 190
    assert sample(setup, "weir_admission_refunded_tokens_total", tenant="acme") == 150


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.CLIENT_DISCONNECTED, Outcome.CANCELLED])
def test_requests_that_produced_nothing_are_refunded_in_full(setup: Setup, outcome: Outcome) -> None:
    acme = tenant(tokens_per_minute=1_000)
    admitted = admit(setup, acme, request(10, 90))
    admitted.settle(record(acme, 10, 0, outcome=outcome, ttft_s=None))
    bucket = setup.budget.allowance("acme", acme.quota).bucket
    assert bucket is not None and bucket.level(setup.clock.now) == 1_000


# -- beam search and defaulted max_tokens (issue 10, defects 4 and 8) ----------------------------


def beam(prompt_len: int, max_tokens: int, beam_width: int, n: int = 1) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, n=n, use_beam_search=True, beam_width=beam_width)
    return EngineRequest(f"b{time.monotonic_ns()}", (1,) * prompt_len, params, arrival_s=100.0)


def defaulted(prompt_len: int, max_model_len: int = 8_192) -> EngineRequest:
    """A chat request without max_tokens: the route fills in the rest of the context."""
    params = SamplingParams(max_tokens=max_model_len - prompt_len)
    return EngineRequest(
        f"d{time.monotonic_ns()}", (1,) * prompt_len, params, arrival_s=100.0, max_tokens_defaulted=True
    )


def level(s: Setup, t: TenantContext) -> float:
    bucket = s.budget.allowance(t.tenant_id, t.quota).bucket
    assert bucket is not None
    return bucket.level(s.clock.now)


def test_beam_search_reserves_the_prompt_once_and_max_tokens_per_beam(setup: Setup) -> None:
    assert num_reserved_tokens([beam(34, 24, 1)]) == 58  # the beam_width 1
    assert num_reserved_tokens([beam(34, 24, 16)]) == 34 + 16 * 24
    assert num_reserved_tokens([beam(34, 24, 16, n=4)]) == 34 + 16 * 24  # n of the 16 returned
    acme = tenant(tokens_per_minute=10_000)
    admit(setup, acme, beam(34, 24, 1))
    assert level(setup, acme) == 10_000 - 58
    admit(setup, acme, beam(34, 24, 16))
    assert level(setup, acme) == 10_000 - 58 - 418
    assert sample(setup, "weir_admission_reserved_tokens_total", tenant="acme") == 58 + 418


def test_beam_search_is_billed_the_tokens_computed_for_every_beam(setup: Setup) -> None:
    acme = tenant(tokens_per_minute=10_000)
    admitted = admit(setup, acme, beam(34, 24, 16))
    # 24 tokens returned; 1 + 23 * 16 computed over the beams.
    admitted.settle(record(acme, 34, 24, usage=Usage(34, 24, computed_completion_tokens=369)))
    assert level(setup, acme) == 10_000 - (34 + 369)
    narrow = admit(setup, acme, beam(34, 24, 1))
    narrow.settle(record(acme, 34, 24, usage=Usage(34, 24, computed_completion_tokens=24)))
    assert level(setup, acme) == 10_000 - (34 + 369) - (34 + 24)


def test_without_max_tokens_a_bounded_default_is_reserved(setup: Setup) -> None:
    # Reserving the whole context (8,192) would refuse this tenant every default chat call.
    acme = tenant(tokens_per_minute=4_000)
    assert num_reserved_tokens([defaulted(20)]) == 8_192
    admit(setup, acme, defaulted(20))
    assert level(setup, acme) == 4_000 - (20 + 1_024)  # the server's default (AdmissionConfig)
    own = tenant("own", tokens_per_minute=4_000, default_max_tokens_reservation=100)
    admit(setup, own, defaulted(20))
    assert level(setup, own) == 4_000 - 120  # the tenant's own default wins
    explicit = request(20, 3_000)  # an explicit max_tokens is reserved as given
    admit(setup, own, explicit)
    assert level(setup, own) == 4_000 - 120 - 3_020


def test_a_default_larger_than_the_budget_is_reduced_to_fit(setup: Setup) -> None:
    small = tenant(tokens_per_minute=500, tokens_per_day=400)
    admit(setup, small, defaulted(20))  # 20 + 1,024 > 400: reserve the whole (smallest) budget
    assert level(setup, small) == 500 - 400
    with pytest.raises(BadRequestError) as info:  # the prompt alone can never fit: 400, not 429
        admit(setup, tenant("tiny", tokens_per_minute=50), defaulted(60))
    assert info.value.code == "request_too_large"


def test_overshoot_is_debt_that_delays_the_next_admission(setup: Setup) -> None:
    acme = tenant(tokens_per_minute=600, default_max_tokens_reservation=100)  # 10 tokens/s
    admitted = admit(setup, acme, defaulted(10))
    assert level(setup, acme) == 490
    admitted.settle(record(acme, 10, 700))  # generated 600 more than reserved
    assert level(setup, acme) == 600 - 710  # 110 in debt, not lost
    assert sample(setup, "weir_admission_refunded_tokens_total", tenant="acme") == 0
    with pytest.raises(RateLimitError) as info:
        admit(setup, acme, request(10, 10))
    # Retry-After covers the debt plus the request: (110 + 20) / 10 per second.
    assert info.value.headers["retry-after"] == "13"
    assert info.value.headers["x-ratelimit-remaining-tokens"] == "0"
    assert "110 owed" in info.value.message
    setup.clock.now += 12.9
    with pytest.raises(RateLimitError):
        admit(setup, acme, request(10, 10))
    setup.clock.now += 0.2
    admit(setup, acme, request(10, 10))


# -- the default reservation's settings ----------------------------------------------------------


def test_the_default_reservation_is_a_flag_an_env_variable_and_reaches_admission(tmp_path: Any) -> None:
    from weir.cli import build_parser
    from weir.gateway.admission.controller import build_admission
    from weir.gateway.settings.settings import Settings

    args = build_parser().parse_args(["serve", "--default-max-tokens-reservation", "77"])
    assert Settings.from_sources(args, {}).default_max_tokens_reservation == 77
    args = build_parser().parse_args(["serve"])
    env = {"WEIR_DEFAULT_MAX_TOKENS_RESERVATION": "88"}
    assert Settings.from_sources(args, env).default_max_tokens_reservation == 88
    assert Settings().default_max_tokens_reservation == 1_024
    controller = build_admission(Settings(data_dir=tmp_path, default_max_tokens_reservation=77), stats)
    assert controller.config.default_max_tokens_reservation == 77
    with pytest.raises(ValueError, match="default_max_tokens_reservation"):
        Settings(default_max_tokens_reservation=0)
    with pytest.raises(ValueError, match="default_max_tokens_reservation"):
        AdmissionConfig(default_max_tokens_reservation=0)
