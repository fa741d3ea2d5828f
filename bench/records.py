"""What the load generator measured for one request: the unit every report is built from."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class Outcome(enum.Enum):
    """How a request ended, from the client's side."""

    OK = "ok"  # 200 and the stream ended with [DONE] (or a finish_reason)
    CANCELLED = "cancelled"  # the client closed the stream after cancel_after_tokens, as planned
    HTTP_ERROR = "http_error"  # a non-200 status
    CONNECTION_ERROR = "connection_error"  # refused, reset, or the stream was cut mid-way
    TIMEOUT = "timeout"  # no byte within timeout_s, or the request ran past timeout_s
    STREAM_ERROR = "stream_error"  # malformed SSE/JSON, an error event, or a stream without an end
    DEADLINE = "deadline"  # still running when the run's max duration was reached; stopped by us

    @property
    def served(self) -> bool:
        """The server did its part (a planned cancellation is not a failure)."""
        return self in (Outcome.OK, Outcome.CANCELLED)


@dataclass(frozen=True)
class RequestRecord:
    """Timings and counts of one request. Times in ms from the moment it was sent."""

    request_id: str
    tenant: str
    kind: str
    priority: str | None
    max_tokens: int
    scheduled_s: float  # when it was due, seconds from the start of the run
    start_s: float  # when it was actually sent, seconds from the start of the run
    status_code: int  # HTTP status; 0 when no response came back
    outcome: Outcome
    error: str | None = None
    ttft_ms: float | None = None  # first chunk with content
    e2e_ms: float | None = None  # end of stream (or the moment we closed it)
    chunk_offsets_ms: tuple[float, ...] = ()  # arrival of every chunk with content
    prompt_tokens: int | None = None  # from the final usage chunk
    completion_tokens: int | None = None  # from the final usage chunk
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        """Served: 200 and ended normally or by a planned cancellation."""
        return self.outcome.served

    @property
    def completed(self) -> bool:
        """Ran to its end: the only requests whose E2E and TPOT mean anything."""
        return self.outcome is Outcome.OK

    @property
    def error_key(self) -> str | None:
        """Key in `errors_by_status`: the status code, or the failure kind when there was none."""
        if self.ok:
            return None
        if self.outcome is Outcome.HTTP_ERROR:
            return str(self.status_code)
        return self.outcome.value

    @property
    def num_content_chunks(self) -> int:
        """Chunks that carried output text."""
        return len(self.chunk_offsets_ms)

    @property
    def output_tokens(self) -> int:
        """Output tokens: the server's usage count, else the content chunks we saw."""
        return self.completion_tokens if self.completion_tokens is not None else self.num_content_chunks

    @property
    def itl_ms(self) -> tuple[float, ...]:
        """Every interval between consecutive content chunks."""
        c = self.chunk_offsets_ms
        return tuple(c[i] - c[i - 1] for i in range(1, len(c)))

    @property
    def tpot_ms(self) -> float | None:
        """(E2E - TTFT) / (output_tokens - 1), for completed requests of 2 tokens or more."""
        if not self.completed or self.ttft_ms is None or self.e2e_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)

    @property
    def end_s(self) -> float:
        """When it ended, seconds from the start of the run."""
        return self.start_s + (self.e2e_ms or 0.0) / 1000.0

    def to_json(self) -> dict[str, Any]:
        """One line of requests.jsonl (derived ITL/TPOT included for convenience)."""
        out = asdict(self)
        out["outcome"] = self.outcome.value
        out["chunk_offsets_ms"] = [round(x, 3) for x in self.chunk_offsets_ms]
        out["itl_ms"] = [round(x, 3) for x in self.itl_ms]
        out["tpot_ms"] = self.tpot_ms
        out["output_tokens"] = self.output_tokens
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RequestRecord:
        """Read a line of requests.jsonl back."""
        fields = {k: v for k, v in obj.items() if k in cls.__dataclass_fields__}
        fields["outcome"] = Outcome(fields["outcome"])
        fields["chunk_offsets_ms"] = tuple(fields.get("chunk_offsets_ms", ()))
        return cls(**fields)


def write_records(records: Iterable[RequestRecord], path: str | Path) -> None:
    """Write requests.jsonl."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_json()) + "\n")


def read_records(path: str | Path) -> list[RequestRecord]:
    """Read requests.jsonl back (for re-plotting or re-reporting a run)."""
    with open(path, encoding="utf-8") as f:
        return [RequestRecord.from_json(json.loads(line)) for line in f if line.strip()]
