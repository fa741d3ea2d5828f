"""The engine requests every generation endpoint builds (`weir.gateway.routes.engine_requests`)."""

from __future__ import annotations

import pytest

from weir.engine.client import EngineRequest
from weir.engine.request import Priority
from weir.gateway.api.protocol import Endpoint, GenerationOptions
from weir.gateway.http.errors import BadRequestError, PermissionDeniedError
from weir.gateway.routes.engine_requests import DEFAULT_COMPLETION_MAX_TOKENS, engine_requests
from weir.tenancy.context import QuotaLimits, TenantContext

TENANT = TenantContext("t", "k", Priority.STANDARD, 2.0, "scope-t", QuotaLimits(max_output_tokens=50))


def build(
    endpoint: Endpoint, options: GenerationOptions, prompts: tuple[tuple[int, ...], ...] = ((1, 2, 3),)
) -> tuple[EngineRequest, ...]:
    return engine_requests("id", endpoint, prompts, options, TENANT, 0.0, 100)


@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.MESSAGES])
def test_chat_like_endpoints_default_to_the_context_within_the_quota(endpoint: Endpoint) -> None:
    (request,) = build(endpoint, GenerationOptions(max_tokens=None))
    assert request.sampling_params.max_tokens == 50 and request.max_tokens_defaulted
    assert (
        request.tenant_id == "t"
        and request.cache_scope == "scope-t"
        and request.priority is Priority.STANDARD
    )


def test_completions_default_and_several_prompts() -> None:
    requests = build(Endpoint.COMPLETIONS, GenerationOptions(max_tokens=None), ((1,), (2, 3)))
    assert [r.request_id for r in requests] == ["id-0", "id-1"]
    assert {r.sampling_params.max_tokens for r in requests} == {DEFAULT_COMPLETION_MAX_TOKENS}


def test_quota_and_priority_are_the_keys() -> None:
    with pytest.raises(BadRequestError) as info:
        build(Endpoint.MESSAGES, GenerationOptions(max_tokens=51))
    assert info.value.param == "max_tokens"
    with pytest.raises(PermissionDeniedError) as denied:
        build(Endpoint.CHAT, GenerationOptions(max_tokens=5, priority=Priority.INTERACTIVE))
    assert denied.value.param == "priority"
    (lowered,) = build(Endpoint.CHAT, GenerationOptions(max_tokens=5, priority=Priority.BATCH))
    assert lowered.priority is Priority.BATCH
