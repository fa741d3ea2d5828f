"""Batched background writing of usage records."""

from __future__ import annotations

import pytest

from engine.request import FinishReason
from tenancy.enums import UsageStatus
from tenancy.repo import TenancyRepo
from tenancy.schemas import TenantSpec, UsageRecordIn
from tenancy.usage_writer import UsageWriter


def _record(i: int, tenant: str = "acme", status: UsageStatus = UsageStatus.COMPLETED) -> UsageRecordIn:
    return UsageRecordIn(f"r{i}", tenant, None, "m", status, prompt_tokens=i, completion_tokens=1,
                         finish_reason=FinishReason.STOP)  # fmt: skip


def test_records_are_written_in_batches_and_drained_on_close(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec("acme"), actor="t")
    writer = UsageWriter(repo, max_batch=4, flush_interval_s=0.05)
    writer.start()
    for i in range(10):
        writer.submit(_record(i))
    writer.close()
    [day] = repo.usage_by_day("acme")
    assert (day.num_requests, day.prompt_tokens) == (10, sum(range(10)))
    assert writer.stats.num_written == 10


def test_a_bad_record_does_not_lose_the_batch(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec("acme"), actor="t")
    writer = UsageWriter(repo, max_batch=100)
    for i in range(5):
        writer.submit(_record(i, tenant="deleted" if i == 2 else "acme"))
    writer.close()  # never started: drains inline
    assert repo.usage_by_day("acme")[0].num_requests == 4
    assert (writer.stats.num_written, writer.stats.num_failed) == (4, 1)


def test_full_queue_drops_instead_of_blocking(repo: TenancyRepo) -> None:
    repo.create_tenant(TenantSpec("acme"), actor="t")
    writer = UsageWriter(repo, max_queue=2)
    for i in range(3):
        writer.submit(_record(i))
    assert writer.stats.num_dropped == 1
    writer.close()
    assert writer.stats.num_written == 2


def test_settings_are_validated(repo: TenancyRepo) -> None:
    with pytest.raises(ValueError, match="max_batch"):
        UsageWriter(repo, max_batch=0)
