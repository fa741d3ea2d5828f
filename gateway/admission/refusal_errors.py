"""The errors admission refuses with, and their headers as OpenAI sends them.

A 429 carries Retry-After (`retry-after`, `retry-after-ms`) and the `x-ratelimit-*` headers of
the limit that refused; a request larger than the tenant's whole budget gets a 400
`request_too_large` instead, which clients do not retry. Used by the admission controller
(`weir.gateway.admission.controller`), whose 503s carry the same Retry-After headers.
"""

from __future__ import annotations

import math

from weir.gateway.http.errors import BadRequestError, RateLimitError
from weir.tenancy.budgets.principal_budgets import RateWindow
from weir.tenancy.budgets.quotas import Denial, LimitKind


def format_duration(seconds: float) -> str:
    """A duration as OpenAI's `x-ratelimit-reset-*` headers write it: `20ms`, `1.5s`, `6m0s`, `1h2m3s`."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole_minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(int(whole_minutes), 60)
    secs = f"{rest:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def retry_after_headers(seconds: float) -> dict[str, str]:
    """`Retry-After` (whole seconds, at least 1) and `retry-after-ms` for a wait of `seconds`."""
    seconds = max(seconds, 0.001)
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(math.ceil(seconds * 1000))}


def rate_limit_headers(requests: RateWindow | None, tokens: RateWindow | None) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers for the windows that exist (a missing limit sends none)."""
    headers: dict[str, str] = {}
    for unit, window in (("requests", requests), ("tokens", tokens)):
        if window is not None:
            headers[f"x-ratelimit-limit-{unit}"] = str(window.limit)
            headers[f"x-ratelimit-remaining-{unit}"] = str(max(0, window.remaining))
            headers[f"x-ratelimit-reset-{unit}"] = format_duration(window.reset_s)
    return headers


def rate_limit_error(denial: Denial) -> RateLimitError:
    """The 429 for a denial, with Retry-After and the `x-ratelimit-*` headers of the refusing limit."""
    if denial.limit is LimitKind.MAX_CONCURRENT:
        headers = {"x-ratelimit-limit-requests": str(denial.limit_value)}
    elif denial.limit is LimitKind.REQUESTS_PER_MINUTE:
        headers = rate_limit_headers(RateWindow(denial.limit_value, denial.remaining, denial.reset_s), None)
    else:
        headers = {
            "x-ratelimit-limit-tokens": str(denial.limit_value),
            "x-ratelimit-remaining-tokens": str(max(0, denial.remaining)),
            "x-ratelimit-reset-tokens": format_duration(denial.reset_s),
        }
    if denial.retry_after_s is not None:
        headers.update(retry_after_headers(denial.retry_after_s))
    return RateLimitError(denial.message, headers=headers)


def too_large_error(num_tokens: int, limit: int, per: str) -> BadRequestError:
    """The 400 for a request that no wait can admit (a 429 would be retried by clients, in vain)."""
    return BadRequestError(
        f"Request too large: it may use {num_tokens} tokens (the prompt, plus max_tokens for each "
        f"choice or beam) and this API key's limit is {limit} tokens per {per}. Reduce the prompt, "
        "max_tokens, n or beam_width.",
        param="max_tokens",
        code="request_too_large",
    )
