"""Schema fuzzing: schemathesis generates requests from `/openapi.json` and sends them to a real
server (uvicorn on 127.0.0.1, the fake engine, tenancy on SQLite, the prefix-cache admin API).

Every operation is fuzzed, the public ones with a tenant key and the admin ones with the admin
token, with both valid bodies (generated from the document, so they must reach the engine) and
invalid ones. The server must never answer 5xx, and every error must be OpenAI-shaped (Anthropic-shaped
on `/v1/messages`). The Responses routes (`/v1/responses`, its stored responses by id) are fuzzed
like the others, their stored responses in the tenancy database.

`make test` runs a bounded slice (a few cases per operation and mode); `make fuzz` runs the same
tests with `-m fuzz`, 1,000+ cases in all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.e2e.tenancy_server import ADMIN, FullServer, serve_everything

# Cases per operation and generation mode (about 28 operations, 2 modes): `make test` runs a
# bounded, derandomized slice; `make fuzz` (pytest -m fuzz) runs 1,000+ random cases.
NUM_CASES = 2
NUM_FUZZ_CASES = 25

pytestmark = [pytest.mark.slow, pytest.mark.fuzz]


@dataclass
class Tally:
    """What the fuzzer sent and what came back."""

    num_cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    by_operation: dict[str, dict[int, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    num_engine_calls: int = 0


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullServer]:
    with serve_everything(tmp_path_factory.mktemp("fuzz")) as server:
        yield server


def _check(tally: Tally, label: str, status: int, content_type: str, text: str, curl: str) -> None:
    tally.num_cases += 1
    tally.by_status[status] = tally.by_status.get(status, 0) + 1
    counts = tally.by_operation.setdefault(label, {})
    counts[status] = counts.get(status, 0) + 1
    if status >= 500:
        tally.failures.append(f"{label}: {status} {text[:200]}\n  {curl}")
        return
    if status < 400:
        return
    anthropic = label.endswith("POST /v1/messages")  # Anthropic's shape there, OpenAI's elsewhere
    try:
        body = json.loads(text)
        error = body["error"]
        ok = set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
        if anthropic:
            ok = ok and body["type"] == "error" and set(body) == {"type", "error"}
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok or "application/json" not in content_type:
        shape = "Anthropic" if anthropic else "OpenAI"
        tally.failures.append(f"{label}: {status} not {shape}-shaped: {text[:200]}\n  {curl}")


def _runner(
    server: FullServer,
    operation: Any,
    mode: GenerationMode,
    headers: dict[str, str],
    tally: Tally,
    fuzz: bool,
) -> Callable[[], None]:
    """A hypothesis test sending `operation`'s generated cases; failures are tallied, not raised."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=NUM_FUZZ_CASES if fuzz else NUM_CASES,
        deadline=None,
        database=None,
        derandomize=not fuzz,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        # Always the right credentials: negative cases mangle bodies and parameters, not auth
        # (401s are tested elsewhere, and would trip the auth-failure throttle).
        case.headers = {**(case.headers or {}), **headers}
        response = case.call(base_url=server.url, timeout=30)
        _check(
            tally,
            f"{mode.value} {operation.label}",
            response.status_code,
            response.headers.get("content-type", ""),
            response.text,
            case.as_curl_command(),
        )

    return run  # type: ignore[no-any-return]


def _fuzz(server: FullServer, admin: bool, fuzz: bool) -> Tally:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    headers = ADMIN if admin else server.tenant
    tally = Tally()
    calls_before = server.engine.num_generate_calls
    for result in schema.get_all_operations():
        operation = result.ok()
        schemes = {
            name for requirement in operation.definition.raw.get("security", [{}]) for name in requirement
        }
        if ("admin_token" in schemes) != admin:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run = _runner(server, operation, mode, headers, tally, fuzz)
            try:
                run()
            except Unsatisfiable:
                # Nothing to make invalid (no parameters, no body): only positive cases exist.
                assert mode is GenerationMode.NEGATIVE, operation.label
    tally.num_engine_calls = server.engine.num_generate_calls - calls_before
    print(f"\n{'admin' if admin else 'tenant'} pass: {tally.num_cases} cases, statuses {sorted(tally.by_status.items())}, "
          f"{tally.num_engine_calls} reached the engine")  # fmt: skip
    for label, counts in sorted(tally.by_operation.items()):
        print(f"  {label}: {sorted(counts.items())}")
    return tally


def _fuzzing(request: pytest.FixtureRequest) -> bool:
    """Whether this is `make fuzz` (pytest -m fuzz): the long run."""
    return "fuzz" in str(request.config.option.markexpr)


def test_fuzz_with_a_tenant_key(full: FullServer, request: pytest.FixtureRequest) -> None:
    tally = _fuzz(full, admin=False, fuzz=_fuzzing(request))
    assert not tally.failures, "\n".join(tally.failures[:20])
    # The document states what the validator enforces: generated bodies reach the engine.
    assert tally.num_engine_calls > 0
    assert tally.by_status.get(200, 0) > 0


def test_fuzz_with_the_admin_token(full: FullServer, request: pytest.FixtureRequest) -> None:
    tally = _fuzz(full, admin=True, fuzz=_fuzzing(request))
    assert not tally.failures, "\n".join(tally.failures[:20])
    assert sum(n for status, n in tally.by_status.items() if status < 300) > 0
