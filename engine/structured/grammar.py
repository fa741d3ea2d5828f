"""Compiling constraints for one tokenizer: what to compile (`ConstraintSpec`) and the compiler.

The compiler is the xgrammar backend (docs/decisions.md). It runs off the engine thread: the
gateway calls `GrammarBackend.compile` on a worker pool before the request is queued
(`weir.gateway.prompts.grammar`), and only the immutable result crosses into the engine.

A spec's `source` is canonical (a JSON Schema is dumped without spaces), so two requests with
the same constraint share one cache entry. Keys keep their order: the grammar emits an object's
properties in the order its schema lists them, as OpenAI does.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from weir.engine.engine_tokenizer import tokenizer_fingerprint
from weir.engine.errors import InvalidRequestError
from weir.engine.structured.constraints import (
    CompiledConstraint,
    ConstraintError,
    ConstraintKind,
    allowed_tokens,
)

BACKEND = "xgrammar"
# A JSON object of any shape (`response_format: json_object`).
_ANY_OBJECT_SCHEMA = '{"type":"object"}'
# xgrammar prefixes its messages with a timestamp and its source file: "[20:00:23] /x.cc:94: ..."
_BACKEND_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


def backend_version() -> str:
    """The grammar backend and its version: part of every cache key."""
    try:
        return f"{BACKEND}-{importlib.metadata.version(BACKEND)}"
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - the dependency is declared
        return f"{BACKEND}-unknown"


def canonical_json(value: Any) -> str:
    """`value` as JSON without spaces, keys in their order (which decides the output's order)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint to compile: its kind, its canonical source, and the body field it came from."""

    kind: ConstraintKind
    source: str
    param: str = field(default="response_format", compare=False)

    @classmethod
    def json_schema(cls, schema: Any, param: str) -> ConstraintSpec:
        return cls(ConstraintKind.JSON_SCHEMA, canonical_json(schema), param)

    @classmethod
    def json_object(cls, param: str) -> ConstraintSpec:
        return cls(ConstraintKind.JSON_OBJECT, _ANY_OBJECT_SCHEMA, param)

    @classmethod
    def regex(cls, pattern: str, param: str) -> ConstraintSpec:
        return cls(ConstraintKind.REGEX, pattern, param)

    @classmethod
    def choice(cls, choices: Sequence[str], param: str) -> ConstraintSpec:
        return cls(ConstraintKind.CHOICE, canonical_json(list(choices)), param)

    @classmethod
    def grammar(cls, ebnf: str, param: str) -> ConstraintSpec:
        return cls(ConstraintKind.GRAMMAR, ebnf, param)

    @classmethod
    def tool_calls(cls, schema: Any, param: str) -> ConstraintSpec:
        return cls(ConstraintKind.TOOL_CALLS, canonical_json(schema), param)


# xgrammar 0.2.9 writes the characters of a string with minLength / maxLength as this class,
# which admits raw control characters (invalid JSON; found by the property test in
# tests/engine/structured/test_constraints.py). Its plain strings already exclude U+0000-U+001F.
_LOOSE_STRING_CHARACTER = r"[^\"\\\r\n]"
_STRICT_STRING_CHARACTER = r"[^\"\\\x00-\x1f]"


def _json_strings_without_controls(ebnf: str) -> str:
    return ebnf.replace(_LOOSE_STRING_CHARACTER, _STRICT_STRING_CHARACTER)


def _choice_grammar(choices: list[str]) -> str:
    # A JSON string literal is also an EBNF string literal in xgrammar's syntax (same escapes).
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarBackend:
    """Compiles `ConstraintSpec`s for one tokenizer and vocabulary. Thread-safe.

    `vocab_size` is the model's (its logits' width), which may exceed the tokenizer's; the
    extra ids are never admitted. `stop_token_ids` end a grammar (the model's EOS by default).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int] | None = None) -> None:
        import xgrammar

        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.version = backend_version()
        stops = list(stop_token_ids) if stop_token_ids else None
        self._info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stops
        )
        # Our own cache (weir.gateway.prompts.grammar) keys on the canonical spec; xgrammar's is off.
        self._compiler = xgrammar.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)

    @property
    def vocab_size(self) -> int:
        return int(self._info.vocab_size)

    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Compile `spec`; raise InvalidRequestError naming `spec.param` if the backend refuses it."""
        try:
            grammar = self._compile(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            message = _BACKEND_PREFIX.sub("", str(exc).strip()).splitlines()[0] if str(exc).strip() else ""
            raise InvalidRequestError(
                f"'{spec.param}' could not be compiled as a {spec.kind.value} constraint: {message}",
                spec.param,
            ) from None
        compiled = CompiledConstraint(spec.kind, grammar)
        try:  # a grammar with no way to start (`root ::= root`) is the request's error, not the engine's
            allowed_tokens([compiled.matcher()], self.vocab_size, torch.device("cpu"))
        except ConstraintError:
            raise InvalidRequestError(
                f"'{spec.param}' admits no output: its grammar has no first token", spec.param
            ) from None
        return compiled

    def _compile(self, spec: ConstraintSpec) -> Any:
        compiler = self._compiler
        match spec.kind:
            case ConstraintKind.JSON_SCHEMA | ConstraintKind.JSON_OBJECT | ConstraintKind.TOOL_CALLS:
                import xgrammar

                # No free whitespace between tokens: a small model given the choice drifts into
                # runs of spaces and newlines until max_tokens.
                grammar = xgrammar.Grammar.from_json_schema(
                    spec.source, any_whitespace=False, strict_mode=True
                )
                return compiler.compile_grammar(_json_strings_without_controls(str(grammar)))
            case ConstraintKind.REGEX:
                return compiler.compile_regex(spec.source)
            case ConstraintKind.CHOICE:
                return compiler.compile_grammar(_choice_grammar(json.loads(spec.source)))
            case ConstraintKind.GRAMMAR:
                return compiler.compile_grammar(spec.source)
        raise AssertionError(spec.kind)  # pragma: no cover - every kind is matched above
