"""What a request counts for admission: its sequences, the tokens it reserves from the tenant's
budgets and the prompt tokens it adds to the engine's waiting queue."""

from __future__ import annotations

from collections.abc import Sequence

from weir.engine.client import EngineRequest


def num_sequences(request: EngineRequest) -> int:
    """Sequences the engine decodes for a request: its beams under beam search, else its n choices."""
    params = request.sampling_params
    return params.beam_width if params.use_beam_search else params.n


def num_reserved_tokens(requests: Sequence[EngineRequest], default_max_tokens: int | None = None) -> int:
    """What a request reserves: each prompt once, plus max_tokens for each sequence it decodes.

    With `default_max_tokens`, a request whose max_tokens the client left out reserves at most that
    many output tokens per sequence (it may use more; settlement charges the rest as debt).
    """
    total = 0
    for r in requests:
        max_tokens = r.sampling_params.max_tokens
        if r.max_tokens_defaulted and default_max_tokens is not None:
            max_tokens = min(max_tokens, default_max_tokens)
        total += len(r.prompt_token_ids) + num_sequences(r) * max_tokens
    return total


def num_queued_tokens(requests: Sequence[EngineRequest]) -> int:
    """Prompt tokens the request adds to the waiting queue (each choice is prefilled on its own; the
    beams of a beam search share one prefill)."""
    return sum(
        len(r.prompt_token_ids) * (1 if r.sampling_params.use_beam_search else r.sampling_params.n)
        for r in requests
    )
