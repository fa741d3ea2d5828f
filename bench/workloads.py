"""Request traces: one typed request per JSONL line, loaded and saved deterministically.

The line format is the one `shared/workloads/make_workloads.py` writes (id, t, tenant, priority,
kind, messages | prompt, max_tokens, ignore_eos, cancel_after_tokens). One optional field is
ours: `after`, the id of an earlier request that must finish before this one is sent (multi-turn
chat, where a turn cannot start before the previous answer came back).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

PRIORITIES = ("interactive", "standard", "batch")


class RequestKind(enum.Enum):
    """Which OpenAI endpoint a request goes to."""

    CHAT = "chat"
    COMPLETION = "completion"

    @property
    def path(self) -> str:
        """Endpoint path below the server root."""
        return "/v1/chat/completions" if self is RequestKind.CHAT else "/v1/completions"


@dataclass(frozen=True)
class ChatMessage:
    """One chat message of a request."""

    role: str
    content: str


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a trace, as the client will send it."""

    id: str
    t: float  # arrival time in seconds from the start of the run
    tenant: str
    kind: RequestKind
    max_tokens: int
    priority: str | None = None
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    ignore_eos: bool = False
    cancel_after_tokens: int | None = None
    after: str | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id must be a non-empty string")
        if self.t < 0:
            raise ValueError(f"t must be >= 0 (request {self.id})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (request {self.id})")
        if self.priority is not None and self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)} (request {self.id})")
        if self.kind is RequestKind.CHAT and (not self.messages or self.prompt is not None):
            raise ValueError(
                f"messages is required (and prompt not allowed) for kind chat (request {self.id})"
            )
        if self.kind is RequestKind.COMPLETION and (self.prompt is None or self.messages):
            raise ValueError(
                f"prompt is required (and messages not allowed) for kind completion (request {self.id})"
            )
        if self.cancel_after_tokens is not None and self.cancel_after_tokens < 0:
            raise ValueError(f"cancel_after_tokens must be >= 0 (request {self.id})")

    @property
    def prompt_chars(self) -> int:
        """Prompt size in characters (a tokenizer-free size for metadata)."""
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.content) for m in self.messages)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> WorkloadRequest:
        """Build from one decoded trace line; raises ValueError naming the bad field."""
        try:
            kind = RequestKind(obj.get("kind", "chat"))
        except ValueError:
            raise ValueError(f"kind must be chat or completion, got {obj.get('kind')!r}") from None
        raw_messages = obj.get("messages") or []
        if not isinstance(raw_messages, list):
            raise ValueError("messages must be a list")
        messages = []
        for m in raw_messages:
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                raise ValueError("messages entries need string role and content")
            messages.append(ChatMessage(role=m["role"], content=m["content"]))
        for name, typ in (("id", str), ("tenant", str), ("max_tokens", int)):
            if not isinstance(obj.get(name), typ):
                raise ValueError(f"{name} is required and must be {typ.__name__}")
        t = obj.get("t", 0.0)
        if not isinstance(t, int | float):
            raise ValueError("t must be a number")
        cancel = obj.get("cancel_after_tokens")
        if cancel is not None and not isinstance(cancel, int):
            raise ValueError("cancel_after_tokens must be an integer")
        return cls(
            id=obj["id"],
            t=float(t),
            tenant=obj["tenant"],
            kind=kind,
            max_tokens=obj["max_tokens"],
            priority=obj.get("priority"),
            messages=tuple(messages),
            prompt=obj.get("prompt"),
            ignore_eos=bool(obj.get("ignore_eos", False)),
            cancel_after_tokens=cancel,
            after=obj.get("after"),
        )

    def to_json(self) -> dict[str, Any]:
        """The trace line; optional fields are written only when set, so traces round-trip."""
        out: dict[str, Any] = {"id": self.id, "t": self.t, "tenant": self.tenant}
        if self.priority is not None:
            out["priority"] = self.priority
        out["kind"] = self.kind.value
        if self.kind is RequestKind.CHAT:
            out["messages"] = [{"role": m.role, "content": m.content} for m in self.messages]
        else:
            out["prompt"] = self.prompt
        out["max_tokens"] = self.max_tokens
        out["ignore_eos"] = self.ignore_eos
        if self.cancel_after_tokens is not None:
            out["cancel_after_tokens"] = self.cancel_after_tokens
        if self.after is not None:
            out["after"] = self.after
        return out


def parse_trace(lines: Iterable[str]) -> list[WorkloadRequest]:
    """Parse JSONL lines (blank lines skipped) and check ids and `after` references."""
    requests: list[WorkloadRequest] = []
    for num, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("a line must be a JSON object")
            requests.append(WorkloadRequest.from_json(obj))
        except (json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"trace line {num}: {exc}") from None
    check_trace(requests)
    return requests


def check_trace(requests: Sequence[WorkloadRequest]) -> None:
    """Ids are unique and every `after` names an earlier request (so no run can deadlock)."""
    seen: dict[str, float] = {}
    for r in requests:
        if r.id in seen:
            raise ValueError(f"id {r.id!r} appears twice")
        if r.after is not None and (r.after not in seen or seen[r.after] > r.t):
            raise ValueError(
                f"after of request {r.id!r} must name an earlier request (file order and t), got {r.after!r}"
            )
        seen[r.id] = r.t


def load_trace(path: str | Path) -> list[WorkloadRequest]:
    """Load a JSONL trace file, in file order."""
    with open(path, encoding="utf-8") as f:
        return parse_trace(f)


def save_trace(requests: Iterable[WorkloadRequest], path: str | Path) -> None:
    """Write a JSONL trace that `load_trace` reads back unchanged."""
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r.to_json()) + "\n")


def file_sha256(path: str | Path) -> str:
    """Content hash of a trace file, recorded in report metadata."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def take(requests: Sequence[WorkloadRequest], limit: int | None) -> list[WorkloadRequest]:
    """The first `limit` requests in arrival order (file order breaks ties).

    A request whose `after` was cut off keeps its place but loses the dependency.
    """
    ordered = sorted(enumerate(requests), key=lambda p: (p[1].t, p[0]))
    chosen = [r for _, r in ordered[: limit if limit is not None else len(ordered)]]
    kept = {r.id for r in chosen}
    out = []
    for r in chosen:
        if r.after is not None and r.after not in kept:
            r = replace(r, after=None)
        out.append(r)
    return out
