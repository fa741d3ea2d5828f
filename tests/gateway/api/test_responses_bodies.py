"""The Responses bodies (`weir.gateway.api.responses_bodies`): strict at the top, lenient inside
the items the SDKs send back, null as absent, bounds on metadata, and the documented schema."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from weir.gateway.api import responses_bodies as rb


def _body(**fields: Any) -> rb.ResponsesBody:
    return rb.ResponsesBody.model_validate({"model": "m", "input": "x", **fields})


def test_null_fields_are_absent_and_defaults_hold() -> None:
    body = _body(instructions=None, tools=None, temperature=None, store=None, truncation=None)
    assert body.store is True and body.truncation == "disabled" and body.tools is None


def test_earlier_output_items_validate_as_input() -> None:
    body = _body(
        input=[
            {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]},
            {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "status": "completed"},
            {"type": "function_call_output", "call_id": "c", "output": "ok", "status": None},
        ]
    )  # fmt: skip
    assert [type(i) for i in body.input] == [rb.MessageItem, rb.FunctionCallItem, rb.FunctionCallOutputItem]


@pytest.mark.parametrize(
    "fields",
    [
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        {"metadata": {"k" * 65: "v"}},
        {"previous_response_id": "r" * 65},
        {"previous_response_id": ""},
        {"max_output_tokens": 0},
        {"top_p": 1.5},
        {"stream": "yes"},
        {"store": 1},
        {"max_tool_calls": 3},
        {"tools": [{"type": "function", "name": "bad name"}]},
        {"text": {"format": {"type": "json_schema", "schema": {}}}},  # a name is required
    ],
)
def test_out_of_range_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _body(**fields)


def test_the_documented_schema_forbids_unknown_fields() -> None:
    schema = rb.ResponsesBody.model_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"model", "input"}
