"""The crash-billing experiment's summary; the run itself is tests/e2e/test_crash_billing.py."""

from __future__ import annotations

from weir_bench.experiments.crash_billing import StreamBill, StreamReading, summary


def _bill(
    kind: str, delivered: int, billed: int | None, status: str, *, reported: int | None = None
) -> StreamBill:
    return StreamBill(kind, f"r{delivered}", delivered, 8, reported, status, billed, 0.0)


def test_summary_counts_exact_finished_streams_and_cut_shortfalls() -> None:
    bills = [
        _bill("finished", 12, 12, "completed", reported=12),
        _bill("finished", 12, 1, "cancelled", reported=12),  # the bug: a provisional record won
        _bill("cut", 45, 43, "cancelled"),
        _bill("cut", 45, 46, "cancelled"),  # billed past what it delivered
        _bill("cut", 45, 5, "cancelled"),  # under what it had at the checkpoint
    ]
    s = summary(bills)
    assert (s["finished_exact"], s["finished"], s["cut"]) == (1, 2, 3)
    assert s["cut_over_billed"] == 1
    assert s["cut_under_checkpoint"] == 1
    assert s["cut_shortfall_tokens"] == {"max": 40, "median": 2}


def test_a_reading_counts_the_tokens_it_received() -> None:
    reading = StreamReading(max_tokens=10)
    reading.arrivals += [1.0, 1.0, 2.0]
    assert reading.delivered == 3
