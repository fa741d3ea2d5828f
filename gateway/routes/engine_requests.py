"""The engine requests of a validated generation request: one per prompt, within the key's quota.

Shared by every generation endpoint (`weir.gateway.routes.openai`): the tenant's priority class (a
client may lower it, never raise it), its prefix-cache scope, weight and SLOs, the key's prompt and
output bounds, `max_tokens` resolved per prompt (the client's, or the endpoint's default within
the context), and the bounds on the whole request (prompt tokens, sequences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from weir.engine.client import EngineRequest
from weir.engine.errors import ContextLengthError
from weir.engine.latency_targets import LatencyTargets
from weir.engine.structured.call_closing import ClosableConstraint
from weir.engine.structured.constraints import CompiledConstraint
from weir.gateway.admission.accounting import Settle
from weir.gateway.api.openai_bodies import requests as rb
from weir.gateway.api.protocol import Endpoint, GenerationOptions
from weir.gateway.api.tool_calls import ToolsRequest
from weir.gateway.fleet.model_fleet import Lease
from weir.gateway.http.errors import BadRequestError, PermissionDeniedError
from weir.gateway.prompts.prompt_limits import max_request_prompt_tokens
from weir.tenancy.context import TenantContext

# OpenAI's legacy completions default; chat defaults to the rest of the context (and admission
# reserves a bounded default for it, see weir.gateway.admission.controller).
DEFAULT_COMPLETION_MAX_TOKENS = 16
# The body fields that hold the prompt and the output bound, where an endpoint names them otherwise.
_PROMPT_PARAMS = {Endpoint.COMPLETIONS: "prompt", Endpoint.RESPONSES: "input"}
_MAX_TOKENS_PARAMS = {Endpoint.RESPONSES: "max_output_tokens"}


@dataclass(frozen=True)
class Prepared:
    """A generation request checked, routed and tokenized: what admission and the run need.
    `lease` holds its model version until the request settles."""

    tenant: TenantContext
    response_id: str
    model: str
    options: GenerationOptions
    prompts: tuple[tuple[int, ...], ...]
    lease: Lease
    adapter_name: str | None
    tools: ToolsRequest | None


@dataclass(frozen=True)
class AdmittedRun:
    """What admission let through: the engine requests, their settle, the rate-limit headers."""

    requests: tuple[EngineRequest, ...]
    settle: Settle
    headers: tuple[tuple[str, str], ...] = ()


def engine_requests(
    response_id: str,
    endpoint: Endpoint,
    prompts: Sequence[tuple[int, ...]],
    options: GenerationOptions,
    tenant: TenantContext,
    arrival_s: float,
    max_model_len: int,
    constraint: CompiledConstraint | None = None,
    adapter_name: str | None = None,
) -> tuple[EngineRequest, ...]:
    quota = tenant.limits  # the tighter of the tenant's and the key's
    # A client may lower its priority below its tenant's class, never raise it.
    if options.priority is not None and options.priority < tenant.priority:
        raise PermissionDeniedError(
            f"priority '{options.priority.name.lower()}' is above this API key's class "
            f"'{tenant.priority.name.lower()}'",
            param="priority",
            code="priority_not_allowed",
        )
    priority = tenant.priority if options.priority is None else options.priority
    check_request_bounds(endpoint, prompts, options, max_model_len)
    requests = []
    prompt_param = _PROMPT_PARAMS.get(endpoint, "messages")
    max_tokens_param = _MAX_TOKENS_PARAMS.get(endpoint, "max_tokens")
    for i, prompt in enumerate(prompts):
        if quota.max_prompt_tokens is not None and len(prompt) > quota.max_prompt_tokens:
            raise BadRequestError(
                f"the prompt has {len(prompt)} tokens; this API key allows at most {quota.max_prompt_tokens}",
                param=prompt_param,
                code="prompt_too_long",
            )
        max_tokens = options.max_tokens
        if max_tokens is not None:
            if quota.max_output_tokens is not None and max_tokens > quota.max_output_tokens:
                raise BadRequestError(
                    f"{max_tokens_param} is {max_tokens}; this API key allows at most {quota.max_output_tokens}",
                    param=max_tokens_param,
                    code="max_tokens_exceeded",
                )
        elif endpoint is not Endpoint.COMPLETIONS:
            max_tokens = max(max_model_len - len(prompt), 1)
            if quota.max_output_tokens is not None:
                max_tokens = min(max_tokens, quota.max_output_tokens)
        else:
            max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
            if quota.max_output_tokens is not None:
                max_tokens = min(max_tokens, quota.max_output_tokens)
        ContextLengthError.check(len(prompt), max_tokens, max_model_len, prompt_param)
        if isinstance(constraint, ClosableConstraint) and max_tokens < constraint.min_tokens:
            raise BadRequestError(
                f"{max_tokens_param} is {max_tokens}; a complete call of the offered tools needs at least "
                f"{constraint.min_tokens} tokens",
                param=max_tokens_param,
                code="max_tokens_too_small",
            )
        params = options.sampling_params(max_tokens)
        requests.append(
            EngineRequest(
                request_id=response_id if len(prompts) == 1 else f"{response_id}-{i}",
                prompt_token_ids=prompt,
                sampling_params=params,
                tenant_id=tenant.tenant_id,
                priority=priority,
                cache_scope=tenant.cache_scope,
                arrival_s=arrival_s,
                weight=tenant.weight,
                latency=LatencyTargets.from_slo_ms(quota.ttft_slo_ms, quota.tpot_slo_ms),
                max_tokens_defaulted=options.max_tokens is None,
                constraint=constraint,
                adapter_name=adapter_name,
            )
        )
    return tuple(requests)


def check_request_bounds(
    endpoint: Endpoint, prompts: Sequence[tuple[int, ...]], options: GenerationOptions, max_model_len: int
) -> None:
    """Bounds on the whole request: prompt tokens to prefill and sequences across all prompts."""
    param = _PROMPT_PARAMS.get(endpoint, "messages")
    total = sum(len(p) for p in prompts)
    limit = max_request_prompt_tokens(max_model_len)
    if total > limit:
        raise BadRequestError(
            f"the prompts hold {total} tokens together; one request may hold at most {limit}",
            param=param,
            code="prompt_too_long",
        )
    per_prompt = options.beam_width if options.use_beam_search and options.beam_width else options.n
    sequences = len(prompts) * per_prompt
    if sequences > rb.MAX_REQUEST_SEQUENCES:
        raise BadRequestError(
            f"{len(prompts)} prompts x {per_prompt} sequences each = {sequences}; one request may run "
            f"at most {rb.MAX_REQUEST_SEQUENCES}",
            param="beam_width" if options.use_beam_search else "n",
            code="too_many_sequences",
        )
