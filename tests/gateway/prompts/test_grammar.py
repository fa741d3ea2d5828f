"""The grammar service: limits before compiling, the cache, the time limit, metrics.

Compiles run for real (xgrammar) on the tiny byte-level tokenizer of the engine tests; the time
limit is shown with a compile held on an event, so no timing threshold is involved.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from transformers import AutoTokenizer

from tests.engine.tiny_models import make_tiny_tokenizer
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend
from weir.gateway.http.errors import BadRequestError
from weir.gateway.prompts.grammar import GrammarLimits, GrammarService, check_limits

VOCAB = 320


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = tmp_path_factory.mktemp("grammar-tokenizer")
    make_tiny_tokenizer(path, VOCAB)
    return AutoTokenizer.from_pretrained(path)


def _value(registry: CollectorRegistry, name: str, kind: str) -> float:
    return registry.get_sample_value(name, {"kind": kind}) or 0.0


def test_a_second_compile_of_the_same_spec_is_a_cache_hit(tokenizer: Any) -> None:
    registry = CollectorRegistry()
    service = GrammarService(registry=registry)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    first = asyncio.run(
        service.compile(ConstraintSpec.json_schema(schema, "response_format"), tokenizer, VOCAB)
    )
    # The same schema from another request (another dict, another field) is the same entry.
    again = asyncio.run(
        service.compile(ConstraintSpec.json_schema(dict(schema), "structured_outputs.json"), tokenizer, VOCAB)
    )
    assert again is first
    assert _value(registry, "weir_grammar_cache_misses_total", "json_schema") == 1
    assert _value(registry, "weir_grammar_cache_hits_total", "json_schema") == 1
    assert _value(registry, "weir_constrained_requests_total", "json_schema") == 2
    assert registry.get_sample_value("weir_grammar_compile_seconds_count", {"kind": "json_schema"}) == 1
    # Another order of the properties is another grammar (it decides the output's order).
    other = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    assert (
        asyncio.run(service.compile(ConstraintSpec.json_schema(other, "response_format"), tokenizer, VOCAB))
        is not first
    )
    service.close()


def test_another_tokenizer_never_shares_an_entry(tokenizer: Any, tmp_path: Path) -> None:
    make_tiny_tokenizer(tmp_path, 300)
    smaller = AutoTokenizer.from_pretrained(tmp_path)
    service = GrammarService()
    spec = ConstraintSpec.regex("[0-9]+", "structured_outputs.regex")
    a = asyncio.run(service.compile(spec, tokenizer, VOCAB))
    b = asyncio.run(service.compile(spec, smaller, 300))
    assert a is not b and b.grammar.tokenizer_info.vocab_size == 300
    service.close()


@pytest.mark.parametrize(
    "spec, why",
    [
        (
            ConstraintSpec.json_schema({"enum": list(range(100_000))}, "response_format.json_schema.schema"),
            "bytes",
        ),
        (
            ConstraintSpec.json_schema({"enum": list(range(2000))}, "response_format.json_schema.schema"),
            "enum",
        ),
        (ConstraintSpec.regex("a" * 5000, "structured_outputs.regex"), "characters"),
        (ConstraintSpec.regex("[a-z]{1,100000}", "structured_outputs.regex"), "repetition"),
        (
            ConstraintSpec.json_schema({"type": "string", "pattern": "x{999}"}, "structured_outputs.json"),
            "repetition",
        ),
        (
            ConstraintSpec.regex("(((([a-z]{0,256}){0,256}){0,256}){0,256})", "structured_outputs.regex"),
            "4 repetitions nested",
        ),
        (
            ConstraintSpec.json_schema(
                {"type": "string", "pattern": "(a{0,99}){0,99}"}, "response_format.json_schema.schema"
            ),
            "multiply to 9801",
        ),
        (ConstraintSpec.regex("(.{0,8}){0,8}", "structured_outputs.regex"), "72 ways to split"),
        (
            ConstraintSpec.json_schema(
                {"type": "string", "pattern": "([^,]{0,16})+"}, "response_format.json_schema.schema"
            ),
            "ways to split",
        ),
        (ConstraintSpec.choice([str(i) for i in range(1000)], "structured_outputs.choice"), "choices"),
        (ConstraintSpec.grammar("root ::= " + '"a" ' * 40_000, "structured_outputs.grammar"), "bytes"),
    ],
)
def test_specs_over_the_limits_are_refused_before_compiling(spec: ConstraintSpec, why: str) -> None:
    with pytest.raises(BadRequestError) as info:
        check_limits(spec, GrammarLimits())
    assert info.value.param == spec.param and why in info.value.message
    assert info.value.code == "grammar_too_complex"


def test_a_deep_schema_is_refused_and_a_realistic_one_is_not() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(12):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(BadRequestError, match="nested deeper"):
        check_limits(
            ConstraintSpec.json_schema(schema, "response_format.json_schema.schema"), GrammarLimits()
        )
    shallow: dict[str, Any] = {"type": "string"}
    for _ in range(5):
        shallow = {"type": "array", "items": {"type": "object", "properties": {"a": shallow}}}
    check_limits(ConstraintSpec.json_schema(shallow, "response_format.json_schema.schema"), GrammarLimits())


def test_a_compile_past_the_time_limit_is_a_400_naming_the_field(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_compile = GrammarBackend.compile

    def held(self: GrammarBackend, spec: ConstraintSpec) -> Any:
        release.wait()
        return real_compile(self, spec)

    monkeypatch.setattr(GrammarBackend, "compile", held)
    service = GrammarService(GrammarLimits(compile_timeout_s=0.01, num_workers=1))
    spec = ConstraintSpec.regex("[0-9]+", "structured_outputs.regex")
    try:
        with pytest.raises(BadRequestError) as info:
            asyncio.run(service.compile(spec, tokenizer, VOCAB))
        assert (
            info.value.param == "structured_outputs.regex" and "did not compile within" in info.value.message
        )
    finally:
        release.set()
        service.close()


def test_one_tenants_stuck_compiles_never_make_another_tenant_time_out(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant holds at most half the grammar workers until its compiles' threads are done, so
    its stuck compiles (timed out, still running) leave the other half to everyone else."""
    release = threading.Event()
    real_compile = GrammarBackend.compile
    stuck = ConstraintSpec.regex("[0-9]+", "structured_outputs.regex")

    def held(self: GrammarBackend, spec: ConstraintSpec) -> Any:
        if spec == stuck:
            release.wait()
        return real_compile(self, spec)

    monkeypatch.setattr(GrammarBackend, "compile", held)
    service = GrammarService(GrammarLimits(compile_timeout_s=0.2, num_workers=2))

    async def scenario() -> None:
        with pytest.raises(BadRequestError, match="did not compile within"):
            await service.compile(stuck, tokenizer, VOCAB, tenant_id="attacker")
        second = asyncio.create_task(service.compile(stuck, tokenizer, VOCAB, tenant_id="attacker"))
        await asyncio.sleep(0)  # queued in the attacker's own line, not on the second worker
        victim = ConstraintSpec.regex("[a-z]+", "structured_outputs.regex")
        # A guard against a hang, not a speed bound: without the share the victim waits for ever.
        victim_compile = service.compile(victim, tokenizer, VOCAB, tenant_id="victim")
        assert await asyncio.wait_for(victim_compile, 30) is not None
        second.cancel()

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        service.close()


@pytest.mark.parametrize(
    "spec",
    [
        ConstraintSpec.json_schema({"type": "nonsense"}, "response_format.json_schema.schema"),
        ConstraintSpec.regex("(", "structured_outputs.regex"),
        ConstraintSpec.grammar("root ::= root", "structured_outputs.grammar"),
    ],
)
def test_a_spec_the_backend_refuses_or_that_admits_nothing_is_a_400(
    tokenizer: Any, spec: ConstraintSpec
) -> None:
    service = GrammarService()
    with pytest.raises(BadRequestError) as info:
        asyncio.run(service.compile(spec, tokenizer, VOCAB))
    assert info.value.param == spec.param and info.value.code == "invalid_grammar"
    service.close()
