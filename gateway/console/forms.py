"""Form bodies (application/x-www-form-urlencoded), parsed without python-multipart."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request

from weir.gateway.http.errors import BadRequestError, PayloadTooLargeError
from weir.tenancy.errors import FieldError

MAX_FORM_BYTES = 64 * 1024
MAX_FORM_FIELDS = 64


async def read_form(request: Request) -> dict[str, str]:
    """The submitted fields (the last value of a repeated name wins); 413 past `MAX_FORM_BYTES`."""
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        raise PayloadTooLargeError(f"form is larger than {MAX_FORM_BYTES} bytes")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if raw and content_type != "application/x-www-form-urlencoded":
        raise BadRequestError("forms must be sent as application/x-www-form-urlencoded")
    try:
        pairs = parse_qsl(
            raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=MAX_FORM_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        raise BadRequestError("form is not valid UTF-8 urlencoded data") from None
    return {name: value for name, value in pairs}


def optional_int(form: dict[str, str], name: str) -> int | None:
    """A blank field is None (unlimited); anything else must be a whole number, checked by the codec."""
    value = form.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise FieldError(name, "must be a whole number") from None
