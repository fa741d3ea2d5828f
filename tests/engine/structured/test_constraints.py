"""Constrained decoding in the engine: matchers, the sampler's mask, and whole requests.

On a tiny random Llama and its byte-level tokenizer: every constraint kind admits only what its
grammar allows; the sampler never picks a refused token (greedy, sampled, biased); whole requests
give output that parses and validates, with n > 1, recompute and swap preemption (the same tokens
as without preemption), no speculation for constrained requests, and a grammar that admits no
token failing its request alone with its blocks freed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, PreemptionMode, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import InvalidRequestError
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import FinishReason, SamplingParams
from weir.engine.sampling.sampler import Sampler, SamplingContext
from weir.engine.structured.constraints import (
    CompiledConstraint,
    ConstraintError,
    ConstraintKind,
    allowed_tokens,
)
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend

BS = 4
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["ok", "color", "size"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("constraints"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def backend(tiny: Path) -> GrammarBackend:
    engine = _engine(tiny)
    return GrammarBackend(engine.tokenizer, engine.model_config.vocab_size, engine.model_config.eos_token_ids)


@pytest.fixture(scope="module")
def shared_engine(tiny: Path) -> LLMEngine:
    return _engine(tiny)


@pytest.fixture(scope="module")
def tokenizer(tiny: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny)


def _engine(
    path: Path, num_blocks: int = 400, host: int = 0, mode: PreemptionMode = PreemptionMode.AUTO
) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(
                block_size=BS, num_blocks=num_blocks, host_num_blocks=host, preemption_mode=mode
            ),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
        )
    )


def _run(engine: LLMEngine, requests: list[EngineRequest]) -> dict[tuple[str, int], Any]:
    """Run `requests` to the end: (request id, choice index) -> (token ids, text, finish reason, error)."""
    for er in requests:
        engine.add_request(er)
    tokens: dict[tuple[str, int], list[int]] = {}
    text: dict[tuple[str, int], str] = {}
    done: dict[tuple[str, int], Any] = {}
    for _ in range(20_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            key = (o.request_id, o.index)
            tokens.setdefault(key, []).extend(o.new_token_ids)
            text[key] = text.get(key, "") + o.new_text
            if o.finished:
                done[key] = (o.finish_reason, o.error)
    assert not engine.has_unfinished()
    pool = engine.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks - pool.num_pinned_blocks
    return {k: (tokens.get(k, []), text.get(k, ""), *done[k]) for k in done}


def _allowed_texts(constraint: CompiledConstraint, tokenizer: Any, vocab: int) -> set[str]:
    mask = allowed_tokens([constraint.matcher()], vocab, torch.device("cpu"))[0]
    return {tokenizer.decode([i]) for i in mask.nonzero()[:, 0].tolist()}


# -- matchers ------------------------------------------------------------------------------


def test_a_choice_admits_only_the_prefixes_of_its_choices(backend: GrammarBackend, tokenizer: Any) -> None:
    compiled = backend.compile(ConstraintSpec.choice(["yes", "no"], "structured_outputs.choice"))
    texts = _allowed_texts(compiled, tokenizer, backend.vocab_size)
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts)


def test_a_json_schema_starts_with_a_brace_and_refuses_anything_else(
    backend: GrammarBackend, tokenizer: Any
) -> None:
    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, "response_format"))
    assert all(t.startswith("{") for t in _allowed_texts(compiled, tokenizer, backend.vocab_size))
    matcher = compiled.matcher()
    (letter,) = tokenizer.encode("x", add_special_tokens=False)
    with pytest.raises(ConstraintError):
        matcher.accept(letter)
    assert matcher.num_accepted == 0  # a refused token leaves the state unchanged
    for token in tokenizer.encode('{"ok": true', add_special_tokens=False):
        matcher.accept(token)


@pytest.mark.parametrize(
    "spec, accepted, refused",
    [
        (ConstraintSpec.regex(r"[0-9]{3}-[a-z]+", "structured_outputs.regex"), "123-abc", "12a"),
        (ConstraintSpec.grammar('root ::= "a" ("b" | "c")*', "structured_outputs.grammar"), "abcb", "ad"),
        (ConstraintSpec.json_object("response_format"), '{"any": [1, 2]}', "[1]"),
    ],
)
def test_each_kind_accepts_its_language_and_refuses_the_rest(
    backend: GrammarBackend, tokenizer: Any, spec: ConstraintSpec, accepted: str, refused: str
) -> None:
    compiled = backend.compile(spec)
    matcher = compiled.matcher()
    for token in tokenizer.encode(accepted, add_special_tokens=False):
        matcher.accept(token)
    matcher = compiled.matcher()
    with pytest.raises(ConstraintError):
        for token in tokenizer.encode(refused, add_special_tokens=False):
            matcher.accept(token)


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 6}, {"type": "string", "minLength": 1}])
def test_strings_with_a_length_admit_no_raw_control_character(
    backend: GrammarBackend, tokenizer: Any, schema: dict[str, Any]
) -> None:
    """xgrammar 0.2.9 lets these through (invalid JSON); the backend's grammar does not."""
    compiled = backend.compile(ConstraintSpec.json_schema(schema, "response_format"))
    control = tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(tokenizer.encode("\x03")))
    matcher = compiled.matcher()
    for token in tokenizer.encode('"a', add_special_tokens=False):
        matcher.accept(token)
    with pytest.raises(ConstraintError):
        for token in control:
            matcher.accept(token)


@pytest.mark.parametrize(
    "spec",
    [
        ConstraintSpec.json_schema({"type": "nonsense"}, "response_format"),
        ConstraintSpec.regex("(", "structured_outputs.regex"),
        ConstraintSpec.grammar("root ::= ", "structured_outputs.grammar"),
    ],
)
def test_a_spec_the_backend_refuses_is_an_invalid_request_naming_its_field(
    backend: GrammarBackend, spec: ConstraintSpec
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        backend.compile(spec)
    assert info.value.param == spec.param and "/project" not in info.value.message


# -- the sampler ---------------------------------------------------------------------------


def _context(constraint: Any = None, **params: Any) -> SamplingContext:
    return SamplingContext(SamplingParams(**params), [1], [], None, constraint)


def test_the_sampler_picks_only_admitted_tokens_greedy_sampled_and_biased(
    backend: GrammarBackend, tokenizer: Any
) -> None:
    compiled = backend.compile(ConstraintSpec.choice(["yes", "no"], "structured_outputs.choice"))
    vocab = backend.vocab_size
    allowed = allowed_tokens([compiled.matcher()], vocab, torch.device("cpu"))[0]
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    logits[:, ~allowed] += 50.0  # refused tokens are the most likely by far
    banned = int((~allowed).nonzero()[0, 0])
    contexts = [
        _context(compiled.matcher(), temperature=0.0),
        _context(compiled.matcher(), temperature=1.0, top_k=5),
        _context(compiled.matcher(), temperature=1.5, top_p=0.9, logit_bias=((banned, 100.0),)),
        _context(None, temperature=0.0),  # an unconstrained row of the same batch is untouched
    ]
    for _ in range(20):
        results = Sampler(seed=1)(logits, contexts)
        assert all(bool(allowed[r.token_id]) for r in results[:3])
        assert results[3].token_id == int(logits[3].argmax())


def test_the_greedy_choice_is_the_best_admitted_token(backend: GrammarBackend) -> None:
    compiled = backend.compile(ConstraintSpec.regex("[0-9]+", "structured_outputs.regex"))
    vocab = backend.vocab_size
    allowed = allowed_tokens([compiled.matcher()], vocab, torch.device("cpu"))[0]
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(3))
    (result,) = Sampler()(logits, [_context(compiled.matcher(), temperature=0.0)])
    assert result.token_id == int(logits[0].masked_fill(~allowed, float("-inf")).argmax())
    # logprobs are the model's, before the mask
    (result,) = Sampler()(logits, [_context(compiled.matcher(), temperature=0.0, logprobs=0)])
    assert result.logprob is not None
    assert result.logprob.logprob == pytest.approx(float(logits[0].log_softmax(-1)[result.token_id]))


class _Empty:
    """A matcher whose grammar admits nothing."""

    kind = ConstraintKind.GRAMMAR
    vocab_size = 320
    num_accepted = 0
    is_terminated = False
    # Masks are computed in the step (never ahead), so the prefetcher's questions have fixed answers.
    has_next_mask = False
    mask_ready = True
    late = False
    num_late_steps = 0

    def start_mask(self, pool: Any, on_done: Any) -> bool:
        return False

    def wait_mask(self, timeout_s: float) -> bool:
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0

    def accept(self, token_id: int) -> None:
        raise ConstraintError("refused")


def test_a_mask_with_no_admitted_token_raises() -> None:
    with pytest.raises(ConstraintError, match="admits no token"):
        Sampler()(torch.zeros(1, 320), [_context(_Empty(), temperature=0.0)])


# -- whole requests ------------------------------------------------------------------------


def _constrained(
    rid: str, compiled: CompiledConstraint, prompt: tuple[int, ...] = (5, 6, 7, 8, 9), **params: Any
) -> EngineRequest:
    params.setdefault("max_tokens", 60)
    return EngineRequest(rid, prompt, SamplingParams(**params), constraint=compiled)


def test_greedy_and_sampled_choices_parse_and_validate(tiny: Path, backend: GrammarBackend) -> None:
    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, "response_format"))
    results = _run(
        _engine(tiny),
        [
            _constrained("greedy", compiled, temperature=0.0),
            _constrained("sampled", compiled, temperature=1.0, n=4, seed=7),
        ],
    )
    assert len(results) == 5
    for _tokens, text, reason, error in results.values():
        assert error is None and reason is FinishReason.STOP
        jsonschema.validate(json.loads(text), SCHEMA)


def test_max_tokens_ends_a_constrained_request_with_length(tiny: Path, backend: GrammarBackend) -> None:
    compiled = backend.compile(ConstraintSpec.regex("a[a-z]*", "structured_outputs.regex"))
    ((tokens, text, reason, error),) = _run(
        _engine(tiny), [_constrained("r", compiled, temperature=0.0, max_tokens=5)]
    ).values()
    assert reason is FinishReason.LENGTH and error is None and len(tokens) == 5
    assert re.fullmatch("a[a-z]*", text)


def test_stop_strings_still_end_a_constrained_request(tiny: Path, backend: GrammarBackend) -> None:
    compiled = backend.compile(ConstraintSpec.regex("ab(c)+d", "structured_outputs.regex"))
    ((_tokens, text, reason, error),) = _run(
        _engine(tiny), [_constrained("r", compiled, temperature=0.0, stop=("c",))]
    ).values()
    assert reason is FinishReason.STOP and error is None and text == "ab"


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_preempted_constrained_requests_give_the_same_tokens(
    tiny: Path, backend: GrammarBackend, mode: PreemptionMode
) -> None:
    """The matcher lives on the request: after a recompute or a swap it goes on where it was."""
    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, "response_format"))
    prompts = [tuple(range(3 + i, 30 + 3 * i)) for i in range(8)]

    def requests() -> list[EngineRequest]:
        return [
            _constrained(f"r{i}", compiled, p, temperature=0.8, seed=i, max_tokens=40)
            for i, p in enumerate(prompts)
        ]

    reference = _run(_engine(tiny), requests())
    engine = _engine(tiny, num_blocks=40, host=200 if mode is PreemptionMode.SWAP else 0, mode=mode)
    preempted = _run(engine, requests())
    assert engine.stats().num_preemptions > 0
    assert preempted == reference
    for _tokens, text, reason, _error in preempted.values():
        if reason is FinishReason.STOP:
            jsonschema.validate(json.loads(text), SCHEMA)


def test_constrained_requests_are_not_speculated(tiny: Path, backend: GrammarBackend) -> None:
    from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, "response_format"))
    engine = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(block_size=BS, num_blocks=400),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
            speculative=SpeculativeConfig(method=SpeculativeMethod.NGRAM, num_speculative_tokens=3),
        )
    )
    results = _run(engine, [_constrained("r", compiled, temperature=0.0, speculative=True)])
    ((_tokens, text, reason, _error),) = results.values()
    assert reason is FinishReason.STOP
    jsonschema.validate(json.loads(text), SCHEMA)
    assert engine.stats().num_spec_draft_tokens_total == 0


def test_a_grammar_that_admits_nothing_fails_its_request_alone(tiny: Path, backend: GrammarBackend) -> None:
    engine = _engine(tiny)
    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, "response_format"))
    broken = EngineRequest("broken", (5, 6, 7), SamplingParams(max_tokens=8, temperature=0.0))
    ok = _constrained("ok", compiled, temperature=0.0)
    engine.add_request(ok)
    engine.add_request(broken)
    engine.scheduler.requests["broken"].constraint = _Empty()  # type: ignore[assignment]
    results: dict[str, Any] = {}
    for _ in range(1000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            if o.finished:
                results[o.request_id] = (o.finish_reason, o.error)
    assert results["broken"][0] is FinishReason.ERROR and "admits no token" in results["broken"][1]
    assert results["ok"] == (FinishReason.STOP, None)
    pool = engine.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks - pool.num_pinned_blocks


def test_beam_search_with_a_constraint_is_refused(tiny: Path, backend: GrammarBackend) -> None:
    compiled = backend.compile(ConstraintSpec.json_object("response_format"))
    with pytest.raises(InvalidRequestError):
        _engine(tiny).add_request(
            _constrained("r", compiled, use_beam_search=True, beam_width=2, temperature=0.0)
        )


# -- property: generated schemas -------------------------------------------------------------

_LEAVES = st.sampled_from(
    [
        {"type": "boolean"},
        {"type": "null"},
        {"type": "integer", "minimum": -50, "maximum": 50},
        {"type": "string", "maxLength": 6},
        {"enum": ["red", "green", 3, None]},
        {"const": "fixed"},
    ]
)
_NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


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
    return objects | arrays


SCHEMAS = st.recursive(_LEAVES, _composite, max_leaves=6)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_generated_schemas_give_outputs_that_validate(
    tiny: Path, backend: GrammarBackend, shared_engine: LLMEngine, schema: dict[str, Any], seed: int
) -> None:
    """Greedy and sampled outputs that finish with `stop` parse and validate, whatever the schema."""
    compiled = backend.compile(ConstraintSpec.json_schema(schema, "response_format"))
    rid = f"p{seed}-{abs(hash(json.dumps(schema)))}"
    results = _run(
        shared_engine,
        [
            _constrained(rid + "g", compiled, temperature=0.0, max_tokens=48),
            _constrained(rid + "s", compiled, temperature=1.0, seed=seed, max_tokens=48),
        ],
    )
    for _tokens, text, reason, error in results.values():
        assert error is None
        if reason is FinishReason.STOP:
            jsonschema.validate(json.loads(text), schema)
        else:
            assert reason is FinishReason.LENGTH
