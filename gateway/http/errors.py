"""One error type per failure kind, mapped to HTTP in this one place.

Every error body is OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`, but on the
routes that note `ErrorShape.ANTHROPIC` (`/v1/messages`): `{"type": "error", "error": {"type",
"message"}}`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from weir.engine.errors import (
    ENGINE_RETRYABLE,
    ContextLengthError,
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    RequestFailedError,
    RetryableEngineError,
)
from weir.engine.kv.memory_budget import MemoryBudgetError
from weir.engine.kv.prefix_cache_types import InvalidPrefixError, PinCapacityError, UnknownPrefixError
from weir.engine.lora.lora_types import AdapterInUseError, AdapterLoadError
from weir.gateway.http.allowed_methods import allow_header
from weir.tenancy.errors import (
    AdapterExistsError,
    AdapterNotFoundError,
    CacheScopeConflictError,
    FieldError,
    InvalidAdapterTransitionError,
    InvalidModelTransitionError,
    KeyInactiveError,
    KeyNotFoundError,
    LastServingVersionError,
    MigrationRequiredError,
    ModelVersionExistsError,
    ModelVersionNotFoundError,
    NameInUseError,
    TenancyError,
    TenantExistsError,
    TenantNotFoundError,
    VersionNotReadyError,
)

logger = logging.getLogger(__name__)


class WeirError(Exception):
    """Base of all errors the gateway turns into HTTP responses."""

    status_code = 500
    error_type = "server_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, dict[str, str | None]]:
        # Messages may echo client input; a lone surrogate in it could not be encoded as UTF-8.
        return {
            "error": {
                "message": printable(self.message),
                "type": self.error_type,
                "param": None if self.param is None else printable(self.param),
                "code": self.code,
            }
        }


# Anthropic's error `type` by HTTP status (`/v1/messages` answers in Anthropic's shape).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def anthropic_error_body(error: WeirError) -> dict[str, Any]:
    """`error` in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.

    The field OpenAI's shape names in `param` leads the message when the message does not name
    it already; `param` and `code` stay beside, for clients that read them.
    """
    detail = error.body()["error"]
    message, param = detail["message"] or "", detail["param"]
    if param and param not in message:
        message = f"{param}: {message}"
    kind = _ANTHROPIC_TYPES.get(error.status_code)
    if kind is None:
        kind = "invalid_request_error" if error.status_code < 500 else "api_error"
    return {
        "type": "error",
        "error": {"type": kind, "message": message, "param": param, "code": detail["code"]},
    }


class ErrorShape(enum.Enum):
    """How a route's errors are written (noted on `request.state.error_shape` by the route)."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


def printable(text: str) -> str:
    """`text` with anything UTF-8 cannot carry (lone surrogates) escaped as `\\udXXX`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class BadRequestError(WeirError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationError(WeirError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(WeirError):
    status_code = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class NotFoundError(WeirError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class RequestTimeoutError(WeirError):
    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class ConflictError(WeirError):
    status_code = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class MethodNotAllowedError(WeirError):
    """The path exists but not with this method; the handler adds `Allow` (every method it takes)."""

    status_code = 405
    error_type = "invalid_request_error"
    default_code = "405"  # as Starlette's own 405s are coded


class PayloadTooLargeError(WeirError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class HeadersTooLargeError(WeirError):
    status_code = 431
    error_type = "invalid_request_error"
    default_code = "headers_too_large"


class UnprocessableError(WeirError):
    status_code = 422
    error_type = "invalid_request_error"
    default_code = "unprocessable_entity"


class RateLimitError(WeirError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class InternalServerError(WeirError):
    status_code = 500
    error_type = "server_error"
    default_code = "internal_error"


class ServiceUnavailableError(WeirError):
    status_code = 503
    error_type = "server_error"
    default_code = "service_unavailable"


class HTTPStatusError(WeirError):
    """An error Starlette raised itself (no such route, method not allowed), by its status."""

    def __init__(self, status_code: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message, code=str(status_code), headers=headers)
        self.status_code = status_code
        self.error_type = "invalid_request_error" if status_code < 500 else "server_error"


def from_engine_error(exc: Exception) -> WeirError:
    """Translate an engine exception into the gateway's error of the same kind."""
    if isinstance(exc, WeirError):
        return exc
    if isinstance(exc, UnknownPrefixError):
        return NotFoundError(str(exc), code="prefix_not_found")
    if isinstance(exc, PinCapacityError):
        return ConflictError(exc.message, param=exc.param, code="pin_capacity")
    if isinstance(exc, InvalidPrefixError):  # an admin field, like the admin API's others
        return UnprocessableError(exc.message, param=exc.param, code="invalid_value")
    if isinstance(exc, AdapterLoadError):  # the adapter folder an admin named, refused at load
        return BadRequestError(f"adapter refused: {exc}", param="path", code="invalid_adapter")
    if isinstance(exc, AdapterInUseError):
        return ConflictError(str(exc), code="adapter_in_use")
    if isinstance(exc, MemoryBudgetError):
        return ConflictError(str(exc), code="memory_budget_exceeded")
    if isinstance(exc, ContextLengthError):
        return BadRequestError(exc.message, param=exc.param, code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return BadRequestError(exc.message, param=exc.param, code="invalid_value")
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailableError(f"engine unavailable: {exc}", code="engine_unavailable")
    if isinstance(exc, RetryableEngineError):
        return ServiceUnavailableError(str(exc), code=ENGINE_RETRYABLE, headers={"Retry-After": "1"})
    if isinstance(exc, RequestFailedError):
        return InternalServerError(f"engine failed on this request: {exc}", code="engine_error")
    return InternalServerError("internal server error")


class DatabaseUnavailableError(ServiceUnavailableError):
    """The tenancy database is locked, slow or unreachable; retrying later can succeed."""

    default_code = "database_unavailable"


DATABASE_RETRY_AFTER_S = 1

# Every answer of a routed generation request, an error included, names the model version that
# served it (`weir.gateway.routes.openai` notes it on `request.state.model_version`).
MODEL_VERSION_HEADER = "x-weir-model-version"


def from_database_error(exc: SQLAlchemyError) -> WeirError:
    """The HTTP error for a database failure: 503 `database_unavailable`, never a 500.

    Locks, timeouts and lost connections (every DBAPI error, the pool's TimeoutError) are
    transient; anything else raised by SQLAlchemy is a bug and stays a 500.
    """
    if isinstance(exc, DBAPIError | SQLAlchemyTimeoutError | DisconnectionError):
        return DatabaseUnavailableError(
            "The database is unavailable; retry later.",
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
    return InternalServerError("internal server error")


def from_tenancy_error(exc: TenancyError) -> WeirError:
    """The HTTP error for an error the tenancy layer raised on purpose."""
    if isinstance(exc, FieldError):
        if exc.field == "body":
            return BadRequestError(exc.message, code="invalid_body")
        return UnprocessableError(exc.message, param=exc.field, code="invalid_value")
    if isinstance(exc, TenantNotFoundError):
        return NotFoundError(exc.message, param=exc.field)
    if isinstance(exc, KeyNotFoundError):
        return NotFoundError(exc.message)
    if isinstance(exc, ModelVersionNotFoundError):
        return NotFoundError(exc.message, code="model_version_not_found")
    if isinstance(exc, ModelVersionExistsError):
        return ConflictError(exc.message, code="model_version_exists")
    if isinstance(exc, AdapterNotFoundError):  # the same for missing and for another tenant's
        return NotFoundError(exc.message, param="name", code="adapter_not_found")
    if isinstance(exc, AdapterExistsError):
        return ConflictError(exc.message, param="name", code="adapter_exists")
    if isinstance(exc, InvalidAdapterTransitionError):
        return ConflictError(exc.message, param="state", code="invalid_adapter_transition")
    if isinstance(exc, InvalidModelTransitionError):
        return ConflictError(exc.message, param="state", code="invalid_model_transition")
    if isinstance(exc, LastServingVersionError):
        return ConflictError(exc.message, param="version", code="last_serving_version")
    if isinstance(exc, VersionNotReadyError):
        return ConflictError(exc.message, param=exc.field, code="model_version_not_ready")
    if isinstance(exc, NameInUseError):
        return ConflictError(exc.message, param="name", code="name_in_use")
    if isinstance(exc, CacheScopeConflictError):
        return ConflictError(exc.message, param=exc.field, code="cache_scope_conflict")
    if isinstance(exc, TenantExistsError | KeyInactiveError):
        return ConflictError(exc.message)
    if isinstance(exc, MigrationRequiredError):
        return ServiceUnavailableError(exc.message, code="database_not_migrated")
    return BadRequestError(exc.message)


def error_response(exc: WeirError, shape: ErrorShape = ErrorShape.OPENAI) -> JSONResponse:
    """The HTTP response for an error, with its headers (e.g. Retry-After)."""
    body = anthropic_error_body(exc) if shape is ErrorShape.ANTHROPIC else exc.body()
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


# The failure kinds a route may raise and that have an HTTP answer of their own.
KNOWN_ERRORS: tuple[type[Exception], ...] = (
    WeirError,
    HTTPException,
    EngineError,
    TenancyError,
    SQLAlchemyError,
)


def to_http_error(exc: BaseException) -> WeirError:
    """The one mapping from an exception to the HTTP error it is answered with.

    Engine (prefix-cache control included), tenancy, database, admission (a `WeirError` already)
    and Starlette's own errors; anything else is a 500 that says nothing about the cause.
    """
    if isinstance(exc, WeirError):
        return exc
    if isinstance(exc, HTTPException):
        return HTTPStatusError(exc.status_code, exc.detail, exc.headers)
    if isinstance(exc, EngineError):
        return from_engine_error(exc)
    if isinstance(exc, TenancyError):
        return from_tenancy_error(exc)
    if isinstance(exc, SQLAlchemyError):
        return from_database_error(exc)
    return InternalServerError("internal server error")


ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


def exception_handlers(count: Callable[[int], None] | None = None) -> dict[type[Exception], ExceptionHandler]:
    """Starlette exception handlers that answer every error through `to_http_error`.

    `count` (the error metric) sees the status of each one. An exception of no known kind is
    logged with its traceback and answered 500; Starlette then re-raises it to the server.
    """

    async def on_error(request: Request, exc: Exception) -> Response:
        error = to_http_error(exc)
        if isinstance(exc, SQLAlchemyError):
            logger.warning("%s %s: database error: %s", request.method, request.url.path, exc)
        if count is not None:
            count(error.status_code)
        response = error_response(error, getattr(request.state, "error_shape", ErrorShape.OPENAI))
        if error.status_code == 405:  # the whole list of methods the path takes (RFC 9110)
            response.headers.update(allow_header(request.app.router.routes, request.scope))
        version = getattr(request.state, "model_version", None)
        if version is not None:
            response.headers[MODEL_VERSION_HEADER] = version
        return response

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return await on_error(request, exc)

    handlers: dict[type[Exception], ExceptionHandler] = {kind: on_error for kind in KNOWN_ERRORS}
    handlers[Exception] = on_unexpected
    return handlers
