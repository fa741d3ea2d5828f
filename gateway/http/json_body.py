"""Parsing a request body as JSON, with bounds that hostile input cannot get past.

Every JSON body the gateway reads (the OpenAI routes, the admin API, the prefix-cache admin API)
goes through `loads_bounded`, which answers a 400 naming the problem for:

- nesting deeper than `MAX_JSON_DEPTH` (100,000 nested `[` used to raise RecursionError -> 500);
- `NaN`, `Infinity` and `-Infinity`, which Python's parser accepts but JSON does not;
- lone UTF-16 surrogates (`"\\ud800"`, or the same code point as raw bytes), which cannot be
  tokenized, stored or even echoed back in an error message as UTF-8.

The checks cost O(n) in the body size, in C for the common case: the walk over the parsed value
only runs when a cheap scan of the raw bytes says it may find something.
"""

from __future__ import annotations

import json
import re
from typing import Any

from weir.gateway.http.errors import BadRequestError, printable

# Chat content parts sit at depth 4 (body, messages, message, content part); admin bodies at 3.
MAX_JSON_DEPTH = 32

# A `\uD800`-`\uDFFF` escape, or the UTF-8 form of a surrogate code point (0xED 0xA0-0xBF ...),
# which json.loads decodes with 'surrogatepass'. Valid pairs (emoji) also match; the walk decides.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")


def _reject_constant(name: str) -> Any:
    raise BadRequestError(f"request body is not valid JSON: {name} is not a JSON number", code="invalid_json")


def _check(value: Any, *, check_depth: bool, check_text: bool) -> None:
    """Walk the parsed value without recursion: depth, and strings that are not valid Unicode."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if check_depth and depth > MAX_JSON_DEPTH:
            raise BadRequestError(
                f"request body is nested deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep"
            )
        if isinstance(item, dict):
            for key, child in item.items():
                if check_text:
                    _check_text(key)
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif check_text and isinstance(child, str):
                    _check_text(child)
        elif isinstance(item, list):
            for child in item:
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif check_text and isinstance(child, str):
                    _check_text(child)
        elif check_text and isinstance(item, str):
            _check_text(item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequestError(
            "request body contains a lone UTF-16 surrogate (e.g. \\ud800), which is not valid Unicode",
            code="invalid_unicode",
        ) from None


def loads_bounded(raw: bytes) -> Any:
    """`raw` parsed as JSON, or a `BadRequestError` (400) saying why not."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise BadRequestError(
            f"request body is nested deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(
            f"request body is not valid JSON: {printable(str(exc))}", code="invalid_json"
        ) from None
    check_depth = raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH
    check_text = _MAYBE_SURROGATE.search(raw) is not None
    if check_depth or check_text:
        _check(value, check_depth=check_depth, check_text=check_text)
    return value
