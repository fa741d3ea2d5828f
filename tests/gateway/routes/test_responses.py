"""`/v1/responses` over the fake engine, through the openai SDK: answers, events, the stored
conversation per tenant, its quota and context bounds, and hostile bodies refused naming the field
before anything reaches the engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MAX_MODEL_LEN, MODEL, make_app, serve_in_thread, tokenizer
from weir.engine.request import Priority
from weir.gateway.http.errors import AuthenticationError
from weir.gateway.settings.settings import Settings
from weir.tenancy.context import QuotaLimits, TenantContext

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
QUOTA_BYTES = 4000  # the quota test's server


async def _authenticate(authorization: str | None, client_addr: str) -> TenantContext:
    key = (authorization or "").removeprefix("Bearer ")
    if key not in KEYS:
        raise AuthenticationError("invalid API key")
    tenant = KEYS[key]
    return TenantContext(tenant, key, Priority.STANDARD, 1.0, tenant, QuotaLimits())


class Server:
    def __init__(self, engine: FakeEngine, url: str) -> None:
        self.engine, self.url = engine, url

    def client(self, key: str = "key-a") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)

    def post(self, body: dict[str, Any], key: str = "key-a") -> httpx.Response:
        return httpx.post(self.url + "/v1/responses", json=body, headers={"authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    engine = FakeEngine()
    with serve_in_thread(make_app(engine, authenticate=_authenticate)) as url:
        yield Server(engine, url)


@pytest.fixture
def live(server: Server) -> Server:
    server.engine.reset()
    return server


def _prompt_text(engine: FakeEngine, index: int = -1) -> str:
    return str(tokenizer().decode(list(engine.requests[index].prompt_token_ids)))


def test_plain_answer_is_stored_and_listed(live: Server) -> None:
    live.engine.eos_after = 5
    client = live.client()
    r = client.responses.create(
        model=MODEL, input="say hello", instructions="you are helpful", max_output_tokens=9, temperature=0
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text and r.output[0].content[0].type == "output_text"  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.output_tokens == 5 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "you are helpful" and r.store is True and r.max_output_tokens == 9
    # The prompt is the chat route's: the instructions as the system message, then the input.
    assert _prompt_text(live.engine).startswith("<|im_start|> system you are helpful <|im_end|>")
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    items = client.responses.input_items.list(r.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # type: ignore[union-attr]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_incomplete_when_max_output_tokens_cut_it(live: Server) -> None:
    client = live.client()
    r = client.responses.create(model=MODEL, input="count to ten", max_output_tokens=3, store=False)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert live.engine.requests[-1].sampling_params.max_tokens == 3
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        client.responses.retrieve(r.id)
    events = list(
        client.responses.create(model=MODEL, input="count to ten", max_output_tokens=3, stream=True)
    )
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"  # type: ignore[union-attr]


def test_stream_events_in_order(live: Server) -> None:
    live.engine.eos_after = 4
    client = live.client()
    events = list(
        client.responses.create(model=MODEL, input="tell me a story", max_output_tokens=9, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert final.output_text == text and final.usage is not None and final.usage.output_tokens == 4
    # The stream was stored before its last event.
    assert client.responses.retrieve(final.id).output_text == text
    with client.responses.stream(model=MODEL, input="tell me a story", max_output_tokens=9) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        assert stream.get_final_response().output_text == streamed


def test_previous_response_id_rebuilds_the_conversation(live: Server) -> None:
    live.engine.eos_after = 3
    client = live.client()
    first = client.responses.create(model=MODEL, input="say hello", max_output_tokens=3, temperature=0)
    second = client.responses.create(
        model=MODEL, input="say something", previous_response_id=first.id, max_output_tokens=3, temperature=0
    )
    prompt = _prompt_text(live.engine)
    assert prompt.index("say hello") < prompt.index(first.output_text.strip()) < prompt.index("say something")
    listed = client.responses.input_items.list(second.id, order="asc")
    assert [i.role for i in listed.data] == ["user", "assistant", "user"]  # type: ignore[union-attr]
    assert second.previous_response_id == first.id
    # Another tenant's id is an unknown id, for every route.
    other = live.client("key-b")
    for call in (
        lambda: other.responses.retrieve(first.id),
        lambda: other.responses.input_items.list(first.id),
        lambda: other.responses.delete(first.id),
        lambda: other.responses.create(model=MODEL, input="x", previous_response_id=first.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.responses.retrieve(first.id).id == first.id  # still there for its own tenant


def test_function_call_round_trip(live: Server) -> None:
    live.engine.eos_after = 3
    client = live.client()
    tools: Any = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    # A forced call: the fake engine writes words, so the call is shaped by hand here; the real
    # grammar path is the e2e test's.
    r = client.responses.create(
        model=MODEL, input="hello", tools=tools, tool_choice="auto", max_output_tokens=3
    )
    assert r.tools[0].name == "get_weather" and r.tool_choice == "auto"  # type: ignore[union-attr]
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        tools=tools,
        input=[
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        max_output_tokens=3,
    )
    # The call and its output joined the conversation (their rendering: test_responses_protocol.py).
    assert follow.status == "completed" and len(live.engine.requests[-1].prompt_token_ids) > len(
        live.engine.requests[-2].prompt_token_ids
    )
    listed = client.responses.input_items.list(follow.id, order="asc").data
    assert [i.type for i in listed] == ["message", "message", "function_call", "function_call_output"]


def test_storage_quota() -> None:
    settings = Settings(response_storage_bytes=QUOTA_BYTES)
    with serve_in_thread(make_app(FakeEngine(), settings, authenticate=_authenticate)) as url:
        _fill_the_quota(Server(FakeEngine(), url).client("key-b"))


def _fill_the_quota(client: openai.OpenAI) -> None:
    ids = []
    with pytest.raises(openai.BadRequestError) as info:
        for _ in range(100):
            ids.append(client.responses.create(model=MODEL, input="hello " * 20, max_output_tokens=2).id)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "store" and error["code"] == "storage_quota_exceeded"
    assert "quota" in error["message"] and ids
    # store: false still runs; deleting frees room.
    assert client.responses.create(model=MODEL, input="hello", max_output_tokens=2, store=False).status
    for response_id in ids:
        client.responses.delete(response_id)
    assert client.responses.create(model=MODEL, input="hello", max_output_tokens=2).id


def test_a_conversation_that_outgrows_the_context(live: Server) -> None:
    live.engine.eos_after = 2
    client = live.client()
    previous = None
    long_input = " ".join(["hello world"] * 20)
    refused = None
    for _ in range(20):
        try:
            previous = client.responses.create(
                model=MODEL, input=long_input, previous_response_id=previous, max_output_tokens=8, store=True
            ).id
        except openai.BadRequestError as exc:
            refused = exc
            break
        client_items = client.responses.input_items.list(previous, limit=100)
        assert client_items.data
    assert refused is not None and isinstance(refused.body, dict)
    assert refused.body["param"] == "previous_response_id" and "truncation" in refused.body["message"]
    r = client.responses.create(
        model=MODEL, input=long_input, previous_response_id=previous, max_output_tokens=8, truncation="auto"
    )
    assert r.status == "completed" and len(live.engine.requests[-1].prompt_token_ids) + 8 <= MAX_MODEL_LEN
    kept = client.responses.input_items.list(r.id, order="asc", limit=100).data
    assert kept[-1].content[0].text == long_input  # type: ignore[union-attr]  # the newest input stays
    # Its previous items, that answer and the new input would not fit: the oldest went.
    assert len(kept) < len(client.responses.input_items.list(previous, limit=100).data) + 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": [{"type": "input_image", "image_url": "http://x"}]}, "input[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": MAX_MODEL_LEN}, "input"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "truncation": "sometimes"}, "truncation"),
        (
            {
                "input": "x",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "a",
                        "schema": {"type": "object", "patternProperties": {"a": {}}},
                    }
                },
            },
            "text.format.schema",
        ),
        ({"input": "x", "metadata": {"k": "v" * 600}}, "metadata"),
        (
            {
                "input": "x",
                "tool_choice": {"type": "function", "name": "nope"},
                "tools": [{"type": "function", "name": "f"}],
            },
            "tool_choice.name",
        ),
        ({"input": "x", "stream_options": {}}, "stream_options"),
        ({"input": "x" * 10, "previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": "x"}] * 5000}, "input"),
    ],
)
def test_hostile_bodies_are_refused_naming_the_field(live: Server, body: dict[str, Any], param: str) -> None:
    r = live.post({"model": MODEL, **body})
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert live.engine.num_generate_calls == 0


def test_get_and_delete_need_a_key(live: Server) -> None:
    assert httpx.get(live.url + "/v1/responses/resp_x").status_code == 401
    assert httpx.delete(live.url + "/v1/responses/resp_x").status_code == 401


def test_the_sweeper_deletes_expired_responses() -> None:
    import asyncio
    import datetime as dt

    from weir.gateway.routes.responses import ResponseSweeper
    from weir.tenancy.responses.memory_responses import MemoryResponseStore
    from weir.tenancy.responses.response_records import StoredResponse

    store = MemoryResponseStore()
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    old = StoredResponse("resp_old", {}, (), past, past + dt.timedelta(days=1))
    new = StoredResponse("resp_new", {}, (), past, past + dt.timedelta(days=9))
    store.put("t", old)
    store.put("t", new)
    both = old.num_bytes + new.num_bytes

    async def run() -> None:
        sweeper = ResponseSweeper(store, 0.01)
        await sweeper.start()
        for _ in range(500):  # bounded: the first sweep runs at once
            if store.bytes_used("t", past) < both:  # read at a time both were alive: one is gone
                break
            await asyncio.sleep(0.01)
        await sweeper.stop()

    asyncio.run(run())
    assert store.bytes_used("t", past) == new.num_bytes
    assert store.get("t", "resp_new", past) == new
    with pytest.raises(ValueError, match="interval_s"):
        ResponseSweeper(store, 0)


def test_a_sweep_is_bounded_and_never_doubled() -> None:
    import asyncio
    import datetime as dt
    import threading

    from weir.gateway.routes.responses import ResponseSweeper
    from weir.tenancy.responses.memory_responses import MemoryResponseStore

    gate, calls = threading.Event(), []

    class Stalled(MemoryResponseStore):
        def sweep(self, now: dt.datetime, timeout_s: float | None = None) -> int:
            calls.append(timeout_s)
            gate.wait(30)
            return 3

    async def run() -> None:
        sweeper = ResponseSweeper(Stalled(), 60, timeout_s=0.01)
        assert await sweeper.sweep_once() is None  # past its bound: left running, not awaited
        assert await sweeper.sweep_once() is None  # still running: skipped, not started again
        assert calls == [0.01]  # the store was told the bound too
        gate.set()
        assert sweeper._sweep is not None and await sweeper._sweep == 3
        sweeper.timeout_s = 30
        assert await sweeper.sweep_once() == 3

    asyncio.run(run())
    with pytest.raises(ValueError, match="timeout_s"):
        ResponseSweeper(MemoryResponseStore(), 1, timeout_s=0)
