"""How many other requests' prompts a request's decode waited behind: from guidellm's per-request times.

guidellm's ITL is each request's mean gap after its first token, so it carries every step that
ran while the request decoded, including the steps that prefilled other requests' prompts. A
server that prefills each prompt as it arrives (Weir: low TTFT) interleaves those prefills with
the running streams' decodes; a server that prefills a whole wave of prompts together before
any of them decodes (llama-server under a closed loop of equal requests: all finish in one step,
all come back together) keeps them out of every decode window, and its TTFT carries them instead.

`prefills_in_decode` counts, for each request, the other requests whose first token came inside
its decode window: later than half its mean gap after its own first token (first tokens of one
step reach the client a few milliseconds apart, and are not a prefill this request waited for),
up to its last token. Each such first token ended a prefill that ran while this request decoded.
Its mean over requests tells the two schedules apart in one number: ~0 for waves, up to the
concurrency less one when arrivals are staggered.
Client-side only (no server trace), so it reads the same for every peer.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StreamTimes:
    """One streamed request as the client saw it, seconds on the client's clock (not the
    engine's `weir.engine.request.RequestTimes`)."""

    first_token_s: float
    end_s: float
    num_output_tokens: int

    @property
    def mean_gap_s(self) -> float:
        """Its mean gap between tokens after the first (guidellm's ITL); with one token or none,
        the time from its first token to its end."""
        return (self.end_s - self.first_token_s) / max(1, self.num_output_tokens - 1)


def request_times(report: Mapping[str, Any]) -> list[StreamTimes]:
    """The successful requests of guidellm 0.8.1's benchmarks.json (one benchmark)."""
    requests = report["benchmarks"][0].get("requests", {}).get("successful", [])
    return [
        StreamTimes(
            float(r["request_start_time"]) + float(r["time_to_first_token_ms"]) / 1e3,
            float(r["request_end_time"]),
            int(r.get("output_tokens") or 0),
        )
        for r in requests
        if r.get("time_to_first_token_ms") is not None and r.get("request_end_time") is not None
    ]


def prefills_in_decode(requests: Iterable[StreamTimes]) -> float | None:
    """The mean, over requests, of the other requests' first tokens inside its decode window
    (first token + half its mean gap, last token]; None without requests."""
    times = list(requests)
    if not times:
        return None
    firsts = sorted(t.first_token_s for t in times)
    total = 0
    for t in times:
        # its own first token is before the window, so it is not counted
        opens = t.first_token_s + t.mean_gap_s / 2
        total += max(0, bisect.bisect_right(firsts, t.end_s) - bisect.bisect_right(firsts, opens))
    return total / len(times)
