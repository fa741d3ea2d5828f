"""Constrained decoding: a compiled grammar, and the per-sequence matcher that masks its tokens.

A `CompiledConstraint` is a grammar compiled for one tokenizer and vocabulary (JSON Schema, any
JSON, a regex, a list of choices, an EBNF grammar or a tool-call grammar). It is immutable and
shared: the gateway compiles it off the engine thread (`weir.gateway.prompts.grammar`), caches it and hands
it over in `EngineRequest.constraint`. Each sequence (each choice of an n>1 request) gets its own
`TokenConstraint`, a matcher that lives on the `Request`, so its state survives preemption and
host swap with the tokens it has accepted: a recompute replays the prompt and output through the
model, never through the matcher.

A matcher's next mask can be computed ahead, on a worker thread (`start_mask`; xgrammar
releases the GIL), so a grammar whose masks are slow makes its own sequence late and no other:
`weir.engine.runner.mask_prefetch` starts the masks and times them out, the runner samples only rows whose
mask is ready (`mask_ready`) and the scheduler sits out rows whose mask is `late`.

The sampler asks the matcher which tokens may come next (`allowed`) and masks the others before
penalties' effects, temperature, top-k, top-p and min-p pick among them; `Request.append_token`
advances it with the token that was kept. A grammar that admits no token, or a token it
refuses, raises `ConstraintError`: the engine fails that sequence alone and frees its blocks.

The backend is xgrammar (docs/decisions.md has the measurements behind the choice); nothing
outside this module and `weir.gateway.prompts.grammar` imports it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

import torch

from weir.engine.errors import EngineError

_BITS = 32  # xgrammar packs a mask as int32 words, token i is bit i % 32 of word i // 32


class ConstraintKind(enum.Enum):
    """What a constraint was compiled from (a metrics label and a log field)."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"
    TOOL_CALLS = "tool_calls"


class ConstraintError(EngineError):
    """A sequence's grammar admits no next token, or refused the token chosen."""


@dataclass(frozen=True)
class CompiledConstraint:
    """A grammar compiled for one tokenizer; immutable and thread-safe, shared by requests.

    `grammar` is the backend's compiled object (an `xgrammar.CompiledGrammar`); `key` is the
    digest the gateway cached it under, for logs.
    """

    kind: ConstraintKind
    grammar: Any
    key: str = ""

    def matcher(self) -> TokenConstraint:
        """A fresh matcher at the start of the grammar, for one sequence."""
        return TokenConstraint(self)


class TokenConstraint:
    """The grammar state of one sequence: which tokens may come next; advanced token by token."""

    def __init__(self, compiled: CompiledConstraint) -> None:
        import xgrammar

        self.compiled = compiled
        self._matcher = xgrammar.GrammarMatcher(compiled.grammar)
        self.vocab_size: int = compiled.grammar.tokenizer_info.vocab_size
        self.num_accepted = 0
        # The next mask, computed ahead on a worker ([1, words] int32), or None: computed on demand.
        self._next_mask: Future[torch.Tensor] | None = None
        # Steps the pending mask was not ready when its row was to be sampled (reset by `accept`).
        self.num_late_steps = 0

    @property
    def kind(self) -> ConstraintKind:
        return self.compiled.kind

    @property
    def is_terminated(self) -> bool:
        """Whether the grammar has accepted its stop token: nothing may follow."""
        return bool(self._matcher.is_terminated())

    def fork_backend(self) -> Any:
        """A copy of the backend's matcher in this sequence's state, to walk ahead without
        advancing the sequence (forced tool calls' closing walk, engine/structured/call_closing.py)."""
        if self._next_mask is not None:
            self._next_mask.exception()  # waits: never read the matcher while a worker fills a mask
        return self._matcher.fork()

    @property
    def num_words(self) -> int:
        return (self.vocab_size + _BITS - 1) // _BITS

    @property
    def has_next_mask(self) -> bool:
        """Whether the next mask is being (or has been) computed ahead."""
        return self._next_mask is not None

    @property
    def mask_ready(self) -> bool:
        """Whether the next mask can be read without waiting (computed ahead, or on demand)."""
        return self._next_mask is None or self._next_mask.done()

    @property
    def late(self) -> bool:
        """Whether the next mask is still computing after a step already had to do without it."""
        return self.num_late_steps > 0 and not self.mask_ready

    def start_mask(
        self,
        submit: Callable[[Callable[[], torch.Tensor]], Future[torch.Tensor]],
        on_done: Callable[[Future[torch.Tensor]], None],
    ) -> bool:
        """Compute the next mask through `submit` (it queues the job on a worker); False (nothing
        started) if one is already under way or the grammar has ended. `on_done` runs on the worker
        when the mask is ready."""
        if self._next_mask is not None or self.is_terminated:
            return False
        self._next_mask = submit(self._compute_mask)
        self._next_mask.add_done_callback(on_done)
        return True

    def wait_mask(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the mask computed ahead; True if it is ready."""
        if self._next_mask is None:
            return True
        done, _ = wait([self._next_mask], timeout=timeout_s)
        return bool(done)

    def _compute_mask(self) -> torch.Tensor:
        bitmask = torch.full((1, self.num_words), -1, dtype=torch.int32)  # [1, words]
        self._matcher.fill_next_token_bitmask(bitmask, 0)
        return bitmask

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of `bitmask` ([rows, ceil(vocab / 32)] int32).

        Reads the mask computed ahead when there is one (waiting for it if needed: callers ask
        `mask_ready` first), else computes it here."""
        if self._next_mask is not None:
            mask = self._next_mask.result()  # [1, words]
            bitmask[row, : mask.shape[1]] = mask[0]
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> None:
        """Advance past `token_id`; raise ConstraintError (state unchanged) if the grammar refuses it."""
        if self._next_mask is not None:
            self._next_mask.exception()  # waits: never advance the matcher while a worker reads it
        if self.is_terminated or not self._matcher.accept_token(token_id):
            raise ConstraintError(
                f"the {self.kind.value} constraint does not admit token {token_id} after "
                f"{self.num_accepted} tokens"
            )
        self.num_accepted += 1
        self._next_mask = None  # the mask of the state just left
        self.num_late_steps = 0


def allowed_tokens(
    constraints: Sequence[TokenConstraint], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """The tokens each matcher admits next, as a bool mask [len(constraints), vocab_size].

    Tokens beyond a grammar's vocabulary are not admitted. Raises ConstraintError if a matcher
    admits none (the caller fails that row alone).
    """
    num_words = max((c.vocab_size + _BITS - 1) // _BITS for c in constraints)
    bitmask = torch.full((len(constraints), num_words), -1, dtype=torch.int32)  # [rows, words]
    for row, constraint in enumerate(constraints):
        constraint.fill_bitmask(bitmask, row)
    shifts = torch.arange(_BITS, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [rows, words, 32]
    allowed = bits.reshape(len(constraints), -1).bool()  # [rows, words * 32]
    if allowed.shape[1] < vocab_size:
        pad = torch.zeros(len(constraints), vocab_size - allowed.shape[1], dtype=torch.bool)
        allowed = torch.cat([allowed, pad], dim=1)
    allowed = allowed[:, :vocab_size]  # [rows, vocab]
    for row, constraint in enumerate(constraints):
        allowed[row, constraint.vocab_size :] = False
    empty = (~allowed.any(dim=-1)).nonzero()
    if empty.numel():
        constraint = constraints[int(empty[0, 0])]
        raise ConstraintError(
            f"the {constraint.kind.value} constraint admits no token after {constraint.num_accepted} tokens"
        )
    return allowed.to(device)
