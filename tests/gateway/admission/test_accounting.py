"""After a request: usage records, the admission seam and its settle callback."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.engine.client import EngineRequest
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason, Priority, SamplingParams
from weir.gateway.admission.accounting import (
    Accountant,
    Outcome,
    RequestInfo,
    RequestTally,
    Settle,
    Usage,
    UsageJournal,
    UsageRecord,
    _settle_nothing,
)
from weir.gateway.api.protocol import Endpoint
from weir.gateway.http.errors import RateLimitError
from weir.tenancy.context import QuotaLimits, TenantContext

ACME = TenantContext("acme", "key-1", Priority.STANDARD, 1.0, "acme", QuotaLimits())
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "user": "end-user-7"}


@dataclass
class Recorder:
    """A usage sink and an admission controller that rejects when told to."""

    records: list[UsageRecord] = field(default_factory=list)
    settled: list[UsageRecord] = field(default_factory=list)
    admitted: list[tuple[str, int]] = field(default_factory=list)
    reject: bool = False

    async def admit(self, tenant: TenantContext, requests: Sequence[EngineRequest]) -> Settle:
        if self.reject:
            raise RateLimitError("budget exhausted", headers={"Retry-After": "3"})
        self.admitted.append((tenant.tenant_id, len(requests)))
        return self.settled.append


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeEngine, Recorder, httpx.Client]]:
    engine, recorder = FakeEngine(), Recorder()

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        return ACME

    app = make_app(
        engine, authenticate=authenticate, admission=recorder.admit, usage_sink=recorder.records.append
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        yield engine, recorder, client


@pytest.fixture
def fresh(server: tuple[FakeEngine, Recorder, httpx.Client]) -> tuple[FakeEngine, Recorder, httpx.Client]:
    engine, recorder, client = server
    engine.reset()
    # The app holds the lists' bound `append`s: clear them, do not replace them.
    for items in (recorder.records, recorder.settled, recorder.admitted):
        items.clear()
    recorder.reject = False
    return engine, recorder, client


def test_usage_record_and_settle_after_a_request(fresh: tuple[FakeEngine, Recorder, httpx.Client]) -> None:
    engine, recorder, client = fresh
    engine.num_cached_tokens = 2
    body = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "n": 2}).json()
    assert wait_until(lambda: len(recorder.records) == 1)
    (record,) = recorder.records
    assert record.request_id == body["id"]
    assert (record.tenant_id, record.key_id, record.model, record.endpoint) == (
        "acme",
        "key-1",
        MODEL,
        Endpoint.CHAT,
    )
    assert record.usage == Usage(body["usage"]["prompt_tokens"], 6, 2)
    assert record.outcome is Outcome.COMPLETED
    assert record.finish_reasons == ("length", "length")
    assert record.user == "end-user-7"
    assert recorder.settled == [record]
    assert recorder.admitted == [("acme", 1)]


def test_rejected_admission_never_reaches_the_engine(
    fresh: tuple[FakeEngine, Recorder, httpx.Client],
) -> None:
    engine, recorder, client = fresh
    recorder.reject = True
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "3"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert engine.num_generate_calls == 0
    assert recorder.records == [] and recorder.settled == []


def test_disconnect_is_settled_with_what_was_generated(
    fresh: tuple[FakeEngine, Recorder, httpx.Client],
) -> None:
    engine, recorder, client = fresh
    engine.token_delay_s = 0.02
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 200, "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 6:
                break
    assert wait_until(lambda: len(recorder.settled) == 1)
    (record,) = recorder.settled
    assert record.outcome is Outcome.CLIENT_DISCONNECTED
    assert record.finish_reasons == ("abort",)
    assert 0 < record.usage.completion_tokens < 200


def test_failed_request_is_recorded_as_failed(fresh: tuple[FakeEngine, Recorder, httpx.Client]) -> None:
    engine, recorder, client = fresh
    engine.error_after_tokens = 2
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 500
    assert wait_until(lambda: len(recorder.records) == 1)
    assert recorder.records[0].outcome is Outcome.FAILED
    assert recorder.records[0].finish_reasons == ("error",)


def test_a_failing_sink_does_not_fail_the_request() -> None:
    from weir.gateway.admission.accounting import Accountant, RequestInfo
    from weir.gateway.metrics.registry import GatewayMetrics
    from weir.gateway.metrics.tracing import RequestTracer

    def broken(record: UsageRecord) -> None:
        raise RuntimeError("db down")

    request = EngineRequest("r", (1,), SamplingParams(max_tokens=1))
    info = RequestInfo("r", Endpoint.COMPLETIONS, MODEL, ACME, None, 0.0, request.arrival_s)
    accountant = Accountant(GatewayMetrics(FakeEngine().stats), usage_sink=broken)
    span = RequestTracer(None).start_request("x", {}, {})
    record = accountant.finish(info, RequestTally([request], 1), Outcome.COMPLETED, span, broken)
    assert record.request_id == "r"


def test_tally_counts_choices_with_the_engine_token_count() -> None:
    """The engine counts each choice's tokens; the tally reads that count and never counts again."""
    requests = [
        EngineRequest("a", (1, 2), SamplingParams(max_tokens=9, n=2)),
        EngineRequest("b", (3,), SamplingParams()),
    ]
    tally = RequestTally(requests, 2)

    def out(
        index: int, num_output: int, token_ids: tuple[int, ...] = (7,), finished: bool = False
    ) -> RequestOutput:
        reason = FinishReason.STOP if finished else None
        return RequestOutput(
            "a", index, token_ids, "x", finished, reason, num_output_tokens=num_output, num_cached_tokens=1
        )

    assert tally.observe(0, out(1, 1)) == 1
    assert tally.observe(1, out(0, 1)) == 2
    assert tally.observe(0, out(1, 2)) == 1
    # A last output that carries no token (a stop string cut away, an abort) keeps the engine's count.
    assert tally.observe(0, out(1, 4, token_ids=(), finished=True)) == 1
    assert not tally.prompt_finished(0)
    tally.observe(0, out(0, 1, finished=True))
    assert tally.prompt_finished(0)
    assert tally.num_output_tokens == [1, 4, 1, 0]
    assert tally.finish_reasons == ["stop", "stop", None, None]
    assert tally.usage() == Usage(prompt_tokens=3, completion_tokens=6, cached_tokens=2)


def test_tally_bills_what_a_beam_search_computed_and_reports_what_it_returned() -> None:
    beam = SamplingParams(max_tokens=24, n=2, use_beam_search=True, beam_width=16)
    requests = [EngineRequest("a", (1,) * 34, beam), EngineRequest("b", (2,) * 10, beam)]
    tally = RequestTally(requests, 2)
    for prompt, computed in ((0, 369), (1, 0)):  # the second reports nothing: its returned tokens count
        for index in (0, 1):
            tally.observe(
                prompt,
                RequestOutput(
                    "x", index, (7,) * 24, "t", True, FinishReason.LENGTH,
                    num_output_tokens=24, num_computed_output_tokens=computed,
                ),
            )  # fmt: skip
    usage = tally.usage()
    assert (usage.prompt_tokens, usage.completion_tokens) == (44, 96)  # OpenAI's usage: returned
    assert usage.billed_completion_tokens == 369 + 48  # billed: computed over every beam
    assert usage.billed_total_tokens == 44 + 417
    assert usage.to_openai()["completion_tokens"] == 96
    assert Usage(3, 5).billed_completion_tokens == 5  # nothing reported: the returned tokens


def _accountant_and_stream() -> tuple[
    Accountant, RequestInfo, RequestTally, list[UsageRecord], list[UsageRecord]
]:
    from weir.gateway.metrics.registry import GatewayMetrics

    journal: list[UsageRecord] = []
    sink: list[UsageRecord] = []
    request = EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=4))
    info = RequestInfo("r", Endpoint.COMPLETIONS, MODEL, ACME, None, 0.0, request.arrival_s)
    accountant = Accountant(
        GatewayMetrics(FakeEngine().stats), sink.append, UsageJournal(write=journal.append)
    )
    return accountant, info, RequestTally([request], 1), journal, sink


def _out(num_tokens: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        index=0,
        new_token_ids=(7,),
        new_text="x",
        finished=finished,
        finish_reason=FinishReason.LENGTH if finished else None,
        num_output_tokens=num_tokens,
    )


def test_a_concluded_record_that_still_holds_is_the_request_record_and_not_written_twice() -> None:
    from weir.gateway.metrics.tracing import RequestTracer

    accountant, info, tally, journal, sink = _accountant_and_stream()
    settled: list[UsageRecord] = []
    accountant.begin(info, tally)
    tally.observe(0, _out(1))
    accountant.progress(info, tally)
    tally.observe(0, _out(4, finished=True))
    final = accountant.conclude(info, tally, Outcome.COMPLETED)
    span = RequestTracer(None).start_request("x", {}, {})
    record = accountant.finish(info, tally, Outcome.COMPLETED, span, settled.append, journaled=final)
    assert [(r.outcome, r.usage.completion_tokens) for r in journal] == [
        (Outcome.CANCELLED, 0),
        (Outcome.CANCELLED, 1),
        (Outcome.COMPLETED, 4),
    ]
    assert record is final and settled == [final]
    assert sink == []  # already in the spool: the journal wrote it


def test_a_concluded_record_that_no_longer_holds_goes_to_the_sink() -> None:
    from weir.gateway.metrics.tracing import RequestTracer

    accountant, info, tally, journal, sink = _accountant_and_stream()
    tally.observe(0, _out(2))
    stale = accountant.conclude(info, tally, Outcome.FAILED)
    tally.observe(0, _out(3, finished=True))  # counted after the journal write
    span = RequestTracer(None).start_request("x", {}, {})
    record = accountant.finish(info, tally, Outcome.FAILED, span, _settle_nothing, journaled=stale)
    assert sink == [record] and record.usage.completion_tokens == 3


def test_a_failing_journal_write_is_logged_and_returns_nothing() -> None:
    from weir.gateway.metrics.registry import GatewayMetrics

    def broken(record: UsageRecord) -> None:
        raise OSError("the usage queue is full")

    _, info, tally, _, _ = _accountant_and_stream()
    accountant = Accountant(GatewayMetrics(FakeEngine().stats), None, UsageJournal(write=broken))
    accountant.begin(info, tally)  # never fails the request
    assert accountant.conclude(info, tally, Outcome.COMPLETED) is None
