"""Admission: budgets and 429 headers, settlement refunds, concurrency, queue bound, SLO rejection,
queue deadlines (503, reservation refunded), metrics and goodput."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from engine.client import EngineRequest
from engine.output import EngineStats, RequestOutput
from engine.request import FinishReason, Priority, SamplingParams
from gateway.accounting import Admitted, Outcome, Usage, UsageRecord
from gateway.admission import (
    AdmissionConfig,
    AdmissionController,
    format_duration,
    met_slo,
    num_reserved_tokens,
)
from gateway.admission_metrics import AdmissionMetrics
from gateway.errors import BadRequestError, RateLimitError, ServiceUnavailableError, error_response
from gateway.metrics import GatewayMetrics
from gateway.protocol import Endpoint
from gateway.streaming import DEADLINE_EXCEEDED
from tenancy.context import QuotaLimits, TenantContext
from tenancy.quotas import LocalBudget
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import (
    ADMIN_HEADERS,
    MODEL,
    check_admin_token,
    make_app,
    serve_in_thread,
    wait_until,
)

START = 1_900_000_000.0


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


def tenant(name: str = "acme", priority: Priority = Priority.STANDARD, **quota: Any) -> TenantContext:
    return TenantContext(name, "key", priority, 1.0, name, QuotaLimits(**quota))


def request(
    prompt_len: int = 10, max_tokens: int = 20, priority: Priority = Priority.STANDARD, n: int = 1
) -> EngineRequest:
    return EngineRequest(
        request_id=f"r{time.monotonic_ns()}",
        prompt_token_ids=(1,) * prompt_len,
        sampling_params=SamplingParams(max_tokens=max_tokens, n=n),
        priority=priority,
        arrival_s=100.0,
    )


def record(t: TenantContext, prompt: int, completion: int, **kw: Any) -> UsageRecord:
    values: dict[str, Any] = dict(
        request_id="x",
        tenant_id=t.tenant_id,
        key_id="key",
        model=MODEL,
        endpoint=Endpoint.COMPLETIONS,
        usage=Usage(prompt, completion),
        outcome=Outcome.COMPLETED,
        finish_reasons=("length",),
        created_at=START,
        duration_s=1.0,
        ttft_s=0.1,
    )
    values.update(kw)
    return UsageRecord(**values)


def stats(**kw: Any) -> EngineStats:
    values: dict[str, Any] = dict(
        num_running=0, num_waiting=0, num_total_blocks=100, num_free_blocks=100, block_size=16
    )
    values.update(kw)
    return EngineStats(**values)


@dataclass
class Setup:
    clock: Clock
    budget: LocalBudget
    controller: AdmissionController
    metrics: AdmissionMetrics
    engine_stats: list[EngineStats] = field(default_factory=lambda: [stats()])


@pytest.fixture
def setup() -> Setup:
    from prometheus_client import CollectorRegistry

    clock = Clock()
    budget = LocalBudget(clock)
    metrics = AdmissionMetrics(CollectorRegistry())
    box = [stats()]
    controller = AdmissionController(
        lambda: box[0],
        budget,
        AdmissionConfig(max_queue_time_s=30.0, max_queued_tokens=1_000),
        metrics=metrics,
    )
    return Setup(clock, budget, controller, metrics, box)


def admit(s: Setup, t: TenantContext, *requests: EngineRequest) -> Admitted:
    return asyncio.run(s.controller(t, requests))


def sample(s: Setup, name: str, **labels: str) -> float:
    for metric in (s.metrics.admitted, s.metrics.rejected, s.metrics.slo, s.metrics.reserved_tokens,
                   s.metrics.refunded_tokens):  # fmt: skip
        for family in metric.collect():
            for smp in family.samples:
                if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                    return smp.value
    return 0.0


# -- headers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.02, "20ms"), (0.0, "0ms"), (1.0, "1s"), (1.5, "1.5s"), (360.0, "6m0s"), (3723.0, "1h2m3s")],
)
def test_reset_durations_are_written_like_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_over_budget_is_429_with_openai_headers(setup: Setup) -> None:
    acme = tenant(tokens_per_minute=600)  # 10 tokens per second
    admit(setup, acme, request(10, 500))
    with pytest.raises(RateLimitError) as info:
        admit(setup, acme, request(10, 140))
    error = info.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    headers = error.headers
    assert headers["x-ratelimit-limit-tokens"] == "600"
    assert headers["x-ratelimit-remaining-tokens"] == "90"
    assert headers["x-ratelimit-reset-tokens"] == "51s"  # 510 tokens to refill at 10/s
    assert headers["retry-after"] == "6" and headers["retry-after-ms"] == "6000"
    body = error_response(error).body
    assert b'"type":"rate_limit_error"' in body and b'"code":"rate_limit_exceeded"' in body
    assert sample(setup, "weir_admission_rejected_total", tenant="acme", reason="tokens_per_minute") == 1
    setup.clock.now += 6.0
    admit(setup, acme, request(10, 140))  # Retry-After was enough


def test_a_request_larger_than_the_limit_is_a_400_that_clients_do_not_retry(setup: Setup) -> None:
    # A 429 would be retried by the SDKs, in vain: no wait can admit it.
    with pytest.raises(BadRequestError) as info:
        admit(setup, tenant(tokens_per_minute=100), request(10, 100))
    assert info.value.status_code == 400 and info.value.code == "request_too_large"
    assert info.value.param == "max_tokens"
    assert "retry-after" not in info.value.headers and "too large" in info.value.message
    assert "110 tokens" in info.value.message and "100 tokens per minute" in info.value.message
    assert sample(setup, "weir_admission_rejected_total", reason="request_too_large") == 1
    with pytest.raises(BadRequestError):  # also against the daily cap
        admit(setup, tenant("daily", tokens_per_day=50), request(10, 41))


def test_daily_cap_is_429_until_midnight(setup: Setup) -> None:
    acme = tenant(tokens_per_day=100)
    admit(setup, acme, request(10, 80))
    with pytest.raises(RateLimitError) as info:
        admit(setup, acme, request(10, 10))
    assert info.value.headers["x-ratelimit-limit-tokens"] == "100"
    assert info.value.headers["x-ratelimit-remaining-tokens"] == "10"
    assert int(info.value.headers["retry-after"]) > 0


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


def test_concurrency_cap_is_per_tenant_and_released_at_settlement(setup: Setup) -> None:
    acme = tenant(max_concurrent=1)
    first = admit(setup, acme, request())
    with pytest.raises(RateLimitError) as info:
        admit(setup, acme, request())
    assert info.value.headers["retry-after"] == "1"
    admit(setup, tenant("other", max_concurrent=1), request())  # other tenants are not affected
    first.settle(record(acme, 10, 20))
    admit(setup, acme, request())


def test_rejections_after_the_concurrency_check_release_the_slot(setup: Setup) -> None:
    acme = tenant(max_concurrent=1, tokens_per_minute=50)
    with pytest.raises(BadRequestError):  # too large for the budget
        admit(setup, acme, request(10, 50))
    admit(setup, acme, request(10, 20))
    with pytest.raises(RateLimitError):  # the concurrency cap
        admit(setup, acme, request(10, 20))


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


# -- queue bound, SLO, deadlines -----------------------------------------------------------------


def test_queue_bounded_in_tokens(setup: Setup) -> None:
    setup.engine_stats[0] = stats(num_waiting_tokens=995, prefill_tokens_per_s=100.0)
    with pytest.raises(ServiceUnavailableError) as info:
        admit(setup, tenant(), request(10))
    assert info.value.status_code == 503 and info.value.code == "queue_full"
    assert info.value.headers["retry-after"] == "1"
    admit(setup, tenant(), request(5))
    # Admitted since the engine's last snapshot: counted until the engine has seen it.
    with pytest.raises(ServiceUnavailableError):
        admit(setup, tenant(), request(1))
    # A request added now is in the engine's snapshot after the next step at the latest: the
    # count is kept through one newer snapshot and dropped at the second.
    setup.engine_stats[0] = stats(num_waiting_tokens=995)
    with pytest.raises(ServiceUnavailableError):
        admit(setup, tenant(), request(1))
    setup.engine_stats[0] = stats(num_waiting_tokens=995)
    admit(setup, tenant(), request(1))


def test_interactive_requests_that_cannot_meet_their_ttft_slo_are_rejected_at_once(setup: Setup) -> None:
    # 1,500 interactive tokens ahead at 1,000 tokens/s: 1.5 s + 0.1 s decode step + own prompt.
    setup.engine_stats[0] = stats(
        waiting_tokens_by_priority=(1_500, 0, 40_000),
        num_waiting_tokens=41_500,
        prefill_tokens_per_s=1_000.0,
        decode_steps_per_s=10.0,
        num_running=4,
    )
    setup.controller.config = AdmissionConfig(max_queued_tokens=None)
    quiet = tenant("quiet", Priority.INTERACTIVE, ttft_slo_ms=2_000)
    admit(setup, quiet, request(300, priority=Priority.INTERACTIVE))  # 1.9 s: fits (batch does not count)
    with pytest.raises(ServiceUnavailableError) as info:
        admit(setup, quiet, request(300, priority=Priority.INTERACTIVE))  # the first is ahead now: 2.2 s
    assert info.value.code == "slo_unattainable" and info.value.status_code == 503
    assert int(info.value.headers["retry-after"]) >= 1
    assert sample(setup, "weir_admission_rejected_total", tenant="quiet", reason="slo_unattainable") == 1
    # Lower classes and tenants without an objective are not rejected on predictions.
    admit(setup, tenant("noisy", ttft_slo_ms=2_000), request(300))
    admit(setup, tenant("quiet2", Priority.INTERACTIVE), request(300, priority=Priority.INTERACTIVE))


def test_no_prediction_before_the_engine_measured_its_prefill_rate(setup: Setup) -> None:
    setup.engine_stats[0] = stats(waiting_tokens_by_priority=(10**6, 0, 0))
    setup.controller.config = AdmissionConfig(max_queued_tokens=None)
    admit(setup, tenant("quiet", Priority.INTERACTIVE, ttft_slo_ms=1), request(priority=Priority.INTERACTIVE))


def test_admitted_requests_get_the_queue_deadline(setup: Setup) -> None:
    admitted = admit(setup, tenant(), request(), request())
    assert [r.deadline_s for r in admitted.requests] == [130.0, 130.0]
    setup.controller.config = AdmissionConfig(max_queue_time_s=None)
    assert admit(setup, tenant(), request()).requests[0].deadline_s is None


def test_goodput_counts_completed_requests_that_met_their_slos(setup: Setup) -> None:
    quiet = tenant("quiet", ttft_slo_ms=500, tpot_slo_ms=100)
    admit(setup, quiet, request()).settle(record(quiet, 10, 11, ttft_s=0.4, duration_s=1.3))  # tpot 90 ms
    admit(setup, quiet, request()).settle(record(quiet, 10, 11, ttft_s=0.6, duration_s=1.0))  # ttft missed
    admit(setup, quiet, request()).settle(record(quiet, 10, 11, ttft_s=0.1, duration_s=2.0))  # tpot 190 ms
    assert sample(setup, "weir_slo_requests_total", tenant="quiet", result="met") == 1
    assert sample(setup, "weir_slo_requests_total", tenant="quiet", result="missed") == 2
    assert met_slo(record(quiet, 10, 1, ttft_s=0.1), QuotaLimits(), 1)
    assert sample(setup, "weir_admission_admitted_total", tenant="quiet", priority="standard") == 3


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_queue_time_s"):
        AdmissionConfig(max_queue_time_s=0)
    with pytest.raises(ValueError, match="max_queued_tokens"):
        AdmissionConfig(max_queued_tokens=0)
    with pytest.raises(ValueError, match="slo_margin"):
        AdmissionConfig(slo_margin=0)


def test_a_failing_budget_is_503_and_frees_the_slot(setup: Setup) -> None:
    class Broken(LocalBudget):
        async def take(self, tenant_id: str, limits: QuotaLimits, num_tokens: int) -> Any:
            raise OSError("database down")

    setup.controller.budget = Broken()
    acme = tenant(max_concurrent=1, tokens_per_minute=1_000)
    for _ in range(2):
        with pytest.raises(ServiceUnavailableError) as info:
            admit(setup, acme, request())
        assert info.value.code == "budget_unavailable"


# -- through HTTP --------------------------------------------------------------------------------


class QueueingEngine(FakeEngine):
    """The fake engine, except that while `hold` is set requests sit in a pretend queue until their
    deadline and are then aborted the way the real engine does it."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        if not self.hold:
            return super().generate(request)
        self.requests.append(request)
        return self._expire(request)

    async def _expire(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        assert request.deadline_s is not None
        await asyncio.sleep(max(0.0, request.deadline_s - time.monotonic()))
        yield RequestOutput(
            request_id=request.request_id,
            index=0,
            new_token_ids=(),
            new_text="",
            finished=True,
            finish_reason=FinishReason.ABORT,
            num_prompt_tokens=len(request.prompt_token_ids),
            error=DEADLINE_EXCEEDED,
        )


@dataclass
class Served:
    engine: QueueingEngine
    budget: LocalBudget
    controller: AdmissionController
    client: httpx.Client
    app: Any


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    engine = QueueingEngine()
    budget = LocalBudget(Clock())  # frozen: no refill during the test
    tenants = {
        "Bearer acme": tenant("acme", tokens_per_minute=100),
        "Bearer batch": tenant("batchy", Priority.BATCH, tokens_per_minute=1_000),
    }

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        return tenants[authorization or ""]

    metrics = GatewayMetrics(engine.stats)
    controller = AdmissionController(
        engine.stats,
        budget,
        AdmissionConfig(max_queue_time_s=0.2),
        metrics=AdmissionMetrics(metrics.registry),
    )
    app = make_app(
        engine,
        authenticate=authenticate,
        admission=controller,
        metrics=metrics,
        metrics_auth=check_admin_token,
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield Served(engine, budget, controller, client, app)


def completion(s: Served, key: str, prompt_len: int, max_tokens: int, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": [1] * prompt_len, "max_tokens": max_tokens, **kw}
    return s.client.post("/v1/completions", json=body, headers={"authorization": f"Bearer {key}"})


def test_http_429_carries_the_headers_and_the_openai_body(served: Served) -> None:
    served.engine.hold = False
    assert completion(served, "acme", 10, 40).status_code == 200
    r = completion(served, "acme", 10, 60)
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert r.json()["error"]["type"] == "rate_limit_error"
    for name in ("retry-after", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"):
        assert name in r.headers
    assert r.headers["x-ratelimit-limit-tokens"] == "100"
    assert r.headers["x-ratelimit-remaining-tokens"] == "50"


def test_http_deadline_is_503_and_the_reservation_is_refunded(served: Served) -> None:
    served.engine.hold = True
    limits = QuotaLimits(tokens_per_minute=1_000)
    bucket = served.budget.allowance("batchy", limits).bucket
    assert bucket is not None
    before = bucket.level(0.0)
    for stream in (False, True):
        r = completion(served, "batch", 20, 200, stream=stream)
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "deadline_exceeded"
        assert wait_until(lambda: bucket.level(0.0) == before)  # settled: everything back
    req = served.engine.requests[-1]
    assert req.deadline_s == pytest.approx(req.arrival_s + 0.2)
    assert served.controller.concurrency.in_flight("batchy") == 0
    text = served.client.get("/metrics", headers=ADMIN_HEADERS).text
    assert 'weir_admission_rejected_total{reason="deadline_exceeded",tenant="batchy"} 2.0' in text


def test_weight_and_priority_reach_the_engine(served: Served) -> None:
    served.engine.hold = False
    assert completion(served, "batch", 5, 2, priority="batch").status_code == 200
    req = served.engine.requests[-1]
    assert req.priority is Priority.BATCH and req.weight == 1.0
    r = completion(served, "batch", 5, 2, priority="standard")
    assert r.status_code == 403 and r.json()["error"]["param"] == "priority"


# -- settings and wiring -------------------------------------------------------------------------


def test_serve_flags_and_environment_reach_the_settings() -> None:
    from engine.config import QueuePolicy
    from gateway.cli import build_parser
    from gateway.settings import AdmissionMode, Settings

    args = build_parser().parse_args(
        ["serve", "--queue-policy", "fcfs", "--admission", "off", "--max-queue-time-s", "12.5"]
    )
    settings = Settings.from_sources(args, {"WEIR_MAX_QUEUED_TOKENS": "0", "WEIR_LEASE_TOKENS": "64"})
    assert settings.queue_policy is QueuePolicy.FCFS and settings.admission is AdmissionMode.OFF
    assert (settings.max_queue_time_s, settings.max_queued_tokens, settings.lease_tokens) == (12.5, 0, 64)
    defaults = Settings()
    assert defaults.queue_policy is QueuePolicy.FAIR and defaults.admission is AdmissionMode.ON
    with pytest.raises(ValueError, match="lease_tokens"):
        Settings(lease_tokens=0)
    with pytest.raises(ValueError, match="max_queue_time_s"):
        Settings(max_queue_time_s=-1)


def test_the_default_reservation_is_a_flag_an_env_variable_and_reaches_admission(tmp_path: Any) -> None:
    from gateway.admission import build_admission
    from gateway.cli import build_parser
    from gateway.settings import Settings

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


def test_sqlite_means_one_replica_with_in_process_budgets(tmp_path: Any) -> None:
    from gateway.admission import build_admission
    from gateway.settings import Settings

    settings = Settings(data_dir=tmp_path, max_queue_time_s=0, max_queued_tokens=0)
    controller = build_admission(settings, stats)
    assert isinstance(controller.budget, LocalBudget)
    assert controller.config.max_queue_time_s is None and controller.config.max_queued_tokens is None
