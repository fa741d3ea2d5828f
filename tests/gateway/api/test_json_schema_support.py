"""The JSON Schema allow-list: enforced keywords compile into grammars whose every answer validates,
refused keywords are a 400 naming the field, the keyword and its path, and references move.

The property test compiles generated schemas for a tiny byte-level tokenizer and walks each
grammar with random admitted tokens (no model): every answer that ends validates with
`jsonschema`.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from tests.engine.tiny_models import make_tiny_tokenizer
from weir.engine.structured.constraints import CompiledConstraint, allowed_tokens
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend
from weir.gateway.api.json_schema_support import REFUSED, check_schema, relocate_refs, resolve_pointer
from weir.gateway.http.errors import BadRequestError

PARAM = "response_format.json_schema.schema"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("schema_tok")
    make_tiny_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> GrammarBackend:
    return GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def _walk(
    compiled: CompiledConstraint, tokenizer: Any, rng: random.Random, max_steps: int = 300
) -> str | None:
    """Random admitted tokens until the grammar ends: the text, or None if it had not ended."""
    matcher = compiled.matcher()
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for _ in range(max_steps):
        mask = allowed_tokens([matcher], len(tokenizer), torch.device("cpu"))[0]
        admitted = mask.nonzero()[:, 0].tolist()
        if eos in admitted and rng.random() < 0.5:
            return tokenizer.decode(ids)
        short = [t for t in admitted if t != eos and len(tokenizer.decode([t])) == 1]
        token = rng.choice(short) if short and rng.random() < 0.8 else rng.choice(admitted)
        if token == eos:
            return tokenizer.decode(ids)
        matcher.accept(token)
        ids.append(token)
    return None


# -- the check -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, keyword, path",
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "$"),
        ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}, "pattern", "$"),
        (
            {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.5}}},
            "multipleOf",
            "$.properties.x",
        ),
        (
            {"type": "object", "properties": {"c": {"$ref": "http://example.com/c.json"}}},
            "$ref",
            "$.properties.c.$ref",
        ),
        ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "patternProperties", "$"),
        ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 4}}, "if", "$"),
        ({"not": {"type": "string"}}, "not", "$"),
        ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas", "$"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "$"),
        ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, "allOf", "$"),
        ({"type": "object", "required": ["zz"]}, "'zz'", "$.required"),
        ({"$defs": {"A": {"type": "string"}}, "$ref": "#/$defs/B"}, "#/$defs/B", "$.$ref"),
        ({"$defs": {"A": {"type": "string"}}, "$ref": "#/$defs/A", "maxLength": 3}, "maxLength", "$"),
        ({"type": "string", "format": "ipv4"}, "ipv4", "$"),
    ],
)
def test_a_keyword_the_grammar_does_not_enforce_is_refused_naming_it_and_its_path(
    schema: dict[str, Any], keyword: str, path: str
) -> None:
    with pytest.raises(BadRequestError) as info:
        check_schema(schema, PARAM)
    error = info.value
    assert error.param == PARAM and error.status_code == 400
    assert keyword in error.message and f"at {path}" in error.message


def test_annotations_and_names_that_are_not_keywords_are_accepted() -> None:
    check_schema(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "T",
            "description": "d",
            "type": "object",
            "properties": {"not": {"type": "string", "examples": ["x"], "default": "x", "x-extra": 1}},
            "required": ["not"],
            "additionalProperties": False,
        },
        PARAM,
    )


def test_a_discriminated_oneof_and_oneof_of_different_types_are_accepted() -> None:
    cat = {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]}
    dog = {
        "type": "object",
        "properties": {"kind": {"const": "dog"}, "age": {"type": "integer"}},
        "required": ["kind"],
    }
    check_schema(
        {"$defs": {"Cat": cat, "Dog": dog}, "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]},
        PARAM,
    )
    check_schema({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}, PARAM)


def test_relocated_references_resolve_in_the_bigger_document() -> None:
    params = {
        "$defs": {"City": {"type": "object", "properties": {"near": {"$ref": "#/$defs/City"}}}},
        "type": "object",
        "properties": {"city": {"$ref": "#/$defs/City"}, "self": {"$ref": "#"}},
        "enum": [{"$ref": "#/data"}],
    }
    moved = relocate_refs(params, "#/$defs/tool")
    document = {"$defs": {"tool": moved}}
    assert resolve_pointer(document, moved["properties"]["city"]["$ref"]) == moved["$defs"]["City"]
    assert resolve_pointer(document, moved["properties"]["self"]["$ref"]) is moved
    assert moved["enum"] == [{"$ref": "#/data"}]  # data, not a schema
    assert params["properties"]["city"]["$ref"] == "#/$defs/City"  # the input is untouched


# -- the property ----------------------------------------------------------------------------

_LEAVES = st.sampled_from(
    [
        {"type": "boolean"},
        {"type": "null"},
        {"type": "integer", "minimum": -50, "maximum": 50},
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 9},
        {"type": "number", "minimum": 1.5, "maximum": 2.5},
        {"type": "string", "maxLength": 6},
        {"type": "string", "minLength": 2, "maxLength": 4},
        {"type": "string", "pattern": "^[a-c]{1,3}$"},
        {"type": "string", "format": "date"},
        {"type": "string", "format": "uuid"},
        {"enum": ["red", "green", 3, None]},
        {"const": "fixed"},
        {"type": ["integer", "null"], "title": "n", "description": "an annotation"},
        {"$ref": "#/$defs/Leaf"},
        {"anyOf": [{"$ref": "#/$defs/Leaf"}, {"type": "null"}], "default": None},
        {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]},
        {"allOf": [{"type": "integer", "minimum": 3, "maximum": 5}]},
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 2}],
            "items": False,
        },
        {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2, "uniqueItems": False},
    ]
)
_NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
_LEAF_DEF = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["id"],
}


def _composite(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    objects = st.dictionaries(_NAMES, children, min_size=1, max_size=3).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props))).map(
            lambda required: {
                "type": "object",
                "properties": props,
                "required": sorted(required),
                "additionalProperties": False,
            }
        )
    )
    arrays = children.map(lambda items: {"type": "array", "items": items, "maxItems": 3})
    tagged = st.tuples(children, children).map(
        lambda pair: {
            "oneOf": [
                {"type": "object", "properties": {"k": {"const": "a"}, "v": pair[0]}, "required": ["k", "v"]},
                {"type": "object", "properties": {"k": {"const": "b"}, "v": pair[1]}, "required": ["k"]},
            ]
        }
    )
    return objects | arrays | tagged


_ALLOWED = st.recursive(_LEAVES, _composite, max_leaves=5).map(
    lambda s: {
        **s,
        "$defs": {"Leaf": _LEAF_DEF, "Tree": {"anyOf": [{"$ref": "#/$defs/Leaf"}, {"type": "null"}]}},
    }
)
_REFUSED_KEYWORDS = sorted(REFUSED - {"$anchor", "$dynamicAnchor", "$recursiveAnchor"})


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schema=_ALLOWED, seed=st.integers(0, 2**16))
def test_every_answer_an_accepted_schema_admits_validates(
    backend: GrammarBackend, tokenizer: Any, schema: dict[str, Any], seed: int
) -> None:
    check_schema(schema, PARAM)
    compiled = backend.compile(ConstraintSpec.json_schema(schema, PARAM))
    rng = random.Random(seed)
    for _ in range(4):
        text = _walk(compiled, tokenizer, rng)
        if text is not None:
            jsonschema.validate(json.loads(text), schema)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schema=_ALLOWED, keyword=st.sampled_from(_REFUSED_KEYWORDS), where=st.integers(0, 3))
def test_a_refused_keyword_anywhere_is_refused(schema: dict[str, Any], keyword: str, where: int) -> None:
    schema = copy.deepcopy(schema)  # the strategy's leaves are shared
    nodes = [schema]
    stack: list[Any] = [schema]
    while stack:  # every schema object of the document, in a fixed order
        node = stack.pop()
        for value in (node.get("properties") or {}).values():
            nodes.append(value)
            stack.append(value)
    target = nodes[where % len(nodes)]
    target[keyword] = {}
    with pytest.raises(BadRequestError) as info:
        check_schema(schema, PARAM)
    assert keyword in info.value.message and info.value.param == PARAM
