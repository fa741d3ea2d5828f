"""gateway/http/errors.py: the tenancy layer's model-version errors as OpenAI-shaped HTTP answers."""

from __future__ import annotations

import json

from weir.gateway.http.errors import error_response, from_tenancy_error, to_http_error
from weir.tenancy.catalog.model_version_records import ModelVersionSpec, check_transition
from weir.tenancy.errors import (
    FieldError,
    InvalidModelTransitionError,
    ModelVersionExistsError,
    ModelVersionNotFoundError,
)
from weir.tenancy.store.enums import ModelVersionState


def _answer(exc: Exception) -> tuple[int, dict[str, object]]:
    response = error_response(to_http_error(exc))
    body = json.loads(bytes(response.body))
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return response.status_code, body["error"]


def test_an_unknown_version_is_404() -> None:
    status, error = _answer(ModelVersionNotFoundError("smol", "v9"))
    assert status == 404
    assert error["code"] == "model_version_not_found"
    assert error["message"] == "model 'smol' has no version 'v9'"
    assert error["type"] == "invalid_request_error"


def test_a_name_without_versions_is_404() -> None:
    status, error = _answer(ModelVersionNotFoundError("smol"))
    assert (status, error["code"]) == (404, "model_version_not_found")


def test_a_duplicate_version_is_409() -> None:
    status, error = _answer(ModelVersionExistsError("smol", "v1"))
    assert (status, error["code"]) == (409, "model_version_exists")


def test_a_refused_transition_is_409_naming_the_allowed_moves() -> None:
    try:
        check_transition("smol", "v1", ModelVersionState.READY, ModelVersionState.RETIRED)
    except InvalidModelTransitionError as exc:
        status, error = _answer(exc)
    assert (status, error["code"], error["param"]) == (409, "invalid_model_transition", "state")
    assert "can become: draining" in str(error["message"])


def test_a_bad_spec_field_is_a_field_error_naming_the_field() -> None:
    try:
        ModelVersionSpec("smol", "v1", "/w", dtype="float64")
    except FieldError as exc:
        status, error = _answer(exc)
    assert (status, error["param"], error["code"]) == (422, "dtype", "invalid_value")


def test_every_model_version_error_is_mapped_on_purpose() -> None:
    # The fallback for an unmapped tenancy error is a bare 400 with no code.
    for exc in (
        ModelVersionNotFoundError("m", "v"),
        ModelVersionExistsError("m", "v"),
        InvalidModelTransitionError("m", "v", "ready", "retired", ["draining"]),
    ):
        assert from_tenancy_error(exc).code is not None
