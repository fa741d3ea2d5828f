"""weir_bench.workloads: trace parsing, validation, round trips, limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weir_bench.workloads import (
    RequestKind,
    WorkloadRequest,
    file_sha256,
    load_trace,
    parse_trace,
    save_trace,
    take,
)

# Lines in the format of shared/workloads/make_workloads.py.
LINES = [
    {
        "id": "mixed-0000",
        "t": 0.25,
        "tenant": "acme",
        "priority": "interactive",
        "kind": "chat",
        "messages": [{"role": "user", "content": "Hello there."}],
        "max_tokens": 12,
        "ignore_eos": True,
    },
    {
        "id": "longctx-0001",
        "t": 0.1,
        "tenant": "globex",
        "priority": "standard",
        "kind": "completion",
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "ignore_eos": True,
    },
    {
        "id": "cancel-0002",
        "t": 0.25,
        "tenant": "acme",
        "priority": "interactive",
        "kind": "chat",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}],
        "max_tokens": 128,
        "ignore_eos": True,
        "cancel_after_tokens": 7,
    },
]


def test_parse_shared_format_and_round_trip(tmp_path: Path) -> None:
    reqs = parse_trace(json.dumps(x) for x in LINES)
    assert [r.kind for r in reqs] == [RequestKind.CHAT, RequestKind.COMPLETION, RequestKind.CHAT]
    assert reqs[2].cancel_after_tokens == 7 and reqs[1].prompt == "Once upon a time"
    assert [r.to_json() for r in reqs] == LINES
    path = tmp_path / "t.jsonl"
    save_trace(reqs, path)
    assert load_trace(path) == reqs
    assert len(file_sha256(path)) == 64


def test_take_orders_by_arrival_and_keeps_file_order_on_ties() -> None:
    reqs = parse_trace(json.dumps(x) for x in LINES)
    assert [r.id for r in take(reqs, None)] == ["longctx-0001", "mixed-0000", "cancel-0002"]
    assert [r.id for r in take(reqs, 2)] == ["longctx-0001", "mixed-0000"]


def test_take_drops_a_dependency_that_was_cut() -> None:
    a = WorkloadRequest(id="a", t=0.0, tenant="x", kind=RequestKind.COMPLETION, max_tokens=1, prompt="p")
    b = WorkloadRequest(
        id="b", t=1.0, tenant="x", kind=RequestKind.COMPLETION, max_tokens=1, prompt="p", after="a"
    )
    assert take([a, b], None)[1].after == "a"
    c = WorkloadRequest(id="c", t=0.5, tenant="x", kind=RequestKind.COMPLETION, max_tokens=1, prompt="p")
    assert [r.after for r in take([c, a, b], 2)] == [None, None]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "embedding"}, "kind"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "3"}, "max_tokens"),
        ({"priority": "urgent"}, "priority"),
        ({"t": -1}, "t"),
        ({"messages": []}, "messages"),
        ({"cancel_after_tokens": -2}, "cancel_after_tokens"),
        ({"tenant": None}, "tenant"),
    ],
)
def test_bad_lines_name_the_field(change: dict, field: str) -> None:
    line = {**LINES[0], **change}
    with pytest.raises(ValueError, match=field):
        parse_trace([json.dumps(line)])


def test_ids_unique_and_after_must_point_back() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_trace([json.dumps(LINES[0]), json.dumps(LINES[0])])
    forward = {**LINES[1], "after": "mixed-0000"}
    with pytest.raises(ValueError, match="after"):
        parse_trace([json.dumps(forward), json.dumps(LINES[0])])
    with pytest.raises(ValueError, match="line 2"):
        parse_trace([json.dumps(LINES[0]), "{not json"])
