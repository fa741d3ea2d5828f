"""Agent frameworks on `/v1/responses`, unchanged, against SmolLM2-135M-Instruct behind a real
server (uvicorn on 127.0.0.1, the real engine on CPU): the OpenAI Agents SDK with its default
Responses model (`OpenAIResponsesModel`) and its `OpenAIChatCompletionsModel` running a function
tool, LangChain with `use_responses_api=True`, and pydantic-ai's Responses
model with a nested pydantic `output_type`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from tests.e2e.real_engine_server import RealServer, serve_engine
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig

agents = pytest.importorskip("agents")
pydantic_ai = pytest.importorskip("pydantic_ai")

pytestmark = pytest.mark.slow

MODEL = "smollm2"


@pytest.fixture(scope="module")
def real(default_model_dir: Path) -> Iterator[RealServer]:
    config = EngineConfig(
        model_path=str(default_model_dir),
        cache=CacheConfig(num_blocks=512, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=2048),
    )
    with serve_engine(config, MODEL) as served:
        yield served


def _weather_run(real: RealServer, model_type: Any) -> None:
    """An agent on `model_type` (one of the SDK's two OpenAI models) that must call its tool and
    stop on the first call: the tool's answer is the agent's."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no export to OpenAI's tracing backend
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is 18 degrees and sunny in {city}."

    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather. Use the get_weather tool.",
        model=model_type(model=MODEL, openai_client=_client(real)),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert calls and isinstance(calls[0], str) and calls[0]
    assert result.final_output == f"It is 18 degrees and sunny in {calls[0]}."


def _client(real: RealServer) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=real.url + "/v1", api_key="local", max_retries=0, timeout=120)


def test_openai_agents_sdk_runs_a_tool_through_its_responses_model(real: RealServer) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner

    _weather_run(real, OpenAIResponsesModel)
    # Without a tool: a plain answer, through the same model.
    plain = Agent(
        name="plain",
        instructions="Answer in one short sentence.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=_client(real)),
        model_settings=ModelSettings(temperature=0, max_tokens=24),
    )
    answer = Runner.run_sync(plain, "What is the capital of France?", max_turns=1)
    assert isinstance(answer.final_output, str) and answer.final_output


def test_openai_agents_sdk_runs_a_tool_through_its_chat_completions_model(real: RealServer) -> None:
    # The same agent on the SDK's other model, which speaks /v1/chat/completions.
    from agents import OpenAIChatCompletionsModel

    _weather_run(real, OpenAIChatCompletionsModel)


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Trip(BaseModel):
    origin: City
    destination: City


def test_pydantic_ai_with_a_nested_output_type(real: RealServer) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(base_url=real.url + "/v1", api_key="local"))
    agent = Agent(model, output_type=Trip, model_settings={"temperature": 0, "max_tokens": 120})
    result = agent.run_sync("Plan a trip from Paris, France to Rome, Italy.")
    assert isinstance(result.output, Trip)
    assert isinstance(result.output.origin, City) and result.output.destination.name


def test_langchain_on_the_responses_api(real: RealServer) -> None:
    # LangChain's ChatOpenAI with `use_responses_api=True` sends /v1/responses: a nested
    # structured output and a bound tool come back parsed.
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        model=MODEL,
        base_url=real.url + "/v1",
        api_key="local",
        temperature=0,
        max_tokens=80,
        max_retries=0,
        use_responses_api=True,
    )
    trip = llm.with_structured_output(Trip, method="json_schema").invoke(
        "A trip from Lyon, France to Oslo, Norway."
    )
    assert isinstance(trip, Trip) and isinstance(trip.origin, City)

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return city

    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Rome?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert isinstance(message.tool_calls[0]["args"].get("city"), str)
