"""The tagged-union discriminators: by `type` among the known ones (a dict or a model), or a
string or a list; anything else is the discriminator's own error, naming what fits."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Tag, TypeAdapter, ValidationError

from weir.gateway.api.openai_bodies.union_tags import (
    string_or_list_discriminator,
    type_discriminator,
    type_tag,
)


class _Text(BaseModel):
    type: Literal["text"]


class _Call(BaseModel):
    type: Literal["call"]


_Block = Annotated[
    Annotated[_Text, Tag("~text")] | Annotated[_Call, Tag("~call")],
    type_discriminator(("text", "call"), "unsupported_parameter", "no images"),
]
_Content = Annotated[
    Annotated[str, Tag("~text")] | Annotated[list[_Block], Tag("~parts")],
    string_or_list_discriminator("parts", "content parts"),
]


def test_type_tag_of_a_dict_or_a_model() -> None:
    assert type_tag({"type": "call"}, ("text", "call")) == "~call"
    assert type_tag(_Text(type="text"), ("text",)) == "~text"
    assert type_tag({"type": "image"}, ("text", "call")) is None
    assert type_tag("text", ("text",)) is None


def test_a_block_by_its_type() -> None:
    assert TypeAdapter(_Block).validate_python({"type": "call"}) == _Call(type="call")


def test_an_unknown_type_names_the_known_ones() -> None:
    with pytest.raises(ValidationError) as e:
        TypeAdapter(_Block).validate_python({"type": "image"})
    (error,) = e.value.errors()
    assert error["type"] == "unsupported_parameter"
    assert error["msg"] == "'type' must be one of text, call (no images)"


def test_one_known_type_is_named_alone() -> None:
    with pytest.raises(ValidationError) as e:
        TypeAdapter(
            Annotated[Annotated[_Text, Tag("~text")], type_discriminator(("text",), "invalid_value")]
        ).validate_python({"type": "x"})
    assert e.value.errors()[0]["msg"] == "'type' must be text"


def test_a_string_or_a_list() -> None:
    adapter = TypeAdapter(_Content)
    assert adapter.validate_python("hi") == "hi"
    assert adapter.validate_python([{"type": "text"}]) == [_Text(type="text")]
    with pytest.raises(ValidationError) as e:
        adapter.validate_python(3)
    (error,) = e.value.errors()
    assert (error["type"], error["msg"]) == ("invalid_type", "must be a string or a list of content parts")
