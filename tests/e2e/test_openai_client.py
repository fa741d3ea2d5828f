"""The official `openai` client against a real server over the fake engine: the plumbing."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MAX_MODEL_LEN, MODEL
from weir.engine.errors import RequestFailedError

MESSAGES = [{"role": "system", "content": "you are helpful"}, {"role": "user", "content": "tell me a story"}]


def test_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    (choice,) = r.choices
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.message.role == "assistant" and len(choice.message.content.split()) == 5  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    assert r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_stream_matches_non_stream(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    whole = client.chat.completions.create(**kwargs).choices[0].message.content  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_stream_usage(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.num_cached_tokens = 3
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
    )
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 4
    assert (
        last.usage.prompt_tokens_details is not None and last.usage.prompt_tokens_details.cached_tokens == 3
    )


def test_completion_stream_and_not(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=4, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason == "length" and len(r.choices[0].text.split()) == 4
    chunks = list(
        client.completions.create(model=MODEL, prompt="hello world", max_tokens=4, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_prompt_forms(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=["hello", "world"], max_tokens=2)
    assert [c.index for c in r.choices] == [0, 1]
    r = client.completions.create(model=MODEL, prompt=[24, 25], max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens == 2
    r = client.completions.create(model=MODEL, prompt=[[24], [25, 24, 25]], max_tokens=2)
    assert len(r.choices) == 2 and r.usage is not None and r.usage.prompt_tokens == 4


def test_n_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, n=3, temperature=1, seed=11
    )  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, n=3, temperature=1, seed=11, stream=True
    )  # type: ignore[call-overload]
    texts = ["", "", ""]
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert texts == [c.message.content for c in r.choices] and finished == {0, 1, 2}


def test_seed_reproducibility(client: openai.OpenAI) -> None:
    def run(seed: int) -> str:
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=seed
        )  # type: ignore[arg-type]
        return r.choices[0].message.content or ""

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_stop(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    words = (base.choices[0].message.content or "").split()
    stop_word = words[3]
    cut = " ".join(words[: words.index(stop_word)])
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stop=[" " + stop_word]
    )  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "stop"
    assert (r.choices[0].message.content or "").strip() == cut
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="hello", max_tokens=8, temperature=0, stop=" " + stop_word, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, logprobs=True, top_logprobs=2
    )  # type: ignore[arg-type]
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    assert [len(t.top_logprobs) for t in content] == [2, 2, 2]
    assert " ".join(t.token for t in content) == (r.choices[0].message.content or "").strip()
    c = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, logprobs=1)
    lp = c.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 3 and len(lp.top_logprobs or []) == 3


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_errors(client: openai.OpenAI, fake: FakeEngine) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature="hot")  # type: ignore[arg-type]
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as ctx:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=MAX_MODEL_LEN)
    assert ctx.value.code == "context_length_exceeded" and "maximum context length" in ctx.value.message
    assert fake.num_generate_calls == 0
    fake.fail_request = lambda req: RequestFailedError("boom")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    fake.fail_request = None
    fake.raise_after_tokens = 2
    with pytest.raises(openai.APIError, match="injected"):
        for _ in client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, stream=True):  # type: ignore[arg-type]
            pass
    fake.raise_after_tokens = None
    fake.alive = False
    with pytest.raises(openai.APIStatusError) as dead:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert dead.value.status_code == 503
    fake.alive = True
    assert client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).choices  # type: ignore[arg-type]


def test_cancelling_a_stream_frees_the_blocks(client: openai.OpenAI, fake: FakeEngine) -> None:
    from tests.gateway.harness import wait_until

    fake.token_delay_s = 0.02
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=200, stream=True)  # type: ignore[arg-type]
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert wait_until(lambda: fake.num_free_blocks == fake.num_total_blocks and fake.num_active == 0)
    assert fake.aborted == [fake.requests[0].request_id]
