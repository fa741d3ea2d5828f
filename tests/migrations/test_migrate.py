"""Migrations: upgrade/downgrade round trip, schema equals the models, the start-up check."""

from __future__ import annotations

import datetime as dt

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from weir.migrations.migrate import (
    MIGRATIONS_DIR,
    check_migrated,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from weir.tenancy.errors import MigrationRequiredError
from weir.tenancy.store.db import Database, safe_url
from weir.tenancy.store.models import Base

WHEN = dt.datetime(2030, 1, 1, 12, 0)  # naive UTC, as the columns store it on SQLite
TABLES_0009 = {
    "tenants",
    "key_limits",
    "principal_buckets",
    "quotas",
    "api_keys",
    "usage_records",
    "audit_events",
    "admin_tokens",
    "budget_buckets",
    "model_versions",
    "model_traffic",
    "lora_adapters",
    "model_prices",
    "window_budgets",
    "window_budget_usage",
    "lora_adapter_grants",
}
ROLLUPS = {"usage_daily", "usage_daily_users"}  # 0010
TABLES_0010 = TABLES_0009 | ROLLUPS
TABLES = TABLES_0010 | {"stored_responses"}  # 0011
NEW_IN_0008 = {"model_prices", "window_budgets", "window_budget_usage"}


def _tables(db: Database) -> set[str]:
    return set(inspect(db.engine).get_table_names()) - {"alembic_version"}


def test_scripts_are_found_next_to_the_package() -> None:
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert head_revision() == "0013"


def test_upgrade_downgrade_round_trip(database: Database) -> None:
    assert current_revision(database.engine) is None
    upgrade(database.engine)
    assert current_revision(database.engine) == head_revision()
    assert _tables(database) == TABLES
    downgrade(database.engine, "base")
    assert current_revision(database.engine) is None
    assert _tables(database) == set()
    upgrade(database.engine)
    assert _tables(database) == TABLES
    usage_indexes = {i["name"] for i in inspect(database.engine).get_indexes("usage_records")}
    downgrade(database.engine)  # one step: 0013 -> 0012 drops the quotas' response storage limits
    quota_columns = {c["name"] for c in inspect(database.engine).get_columns("quotas")}
    assert not quota_columns & {"response_storage_bytes", "response_retention_s"}
    downgrade(database.engine)  # one step: 0012 -> 0011 drops the usage records' endpoint
    assert "endpoint" not in {c["name"] for c in inspect(database.engine).get_columns("usage_records")}
    assert _tables(database) == TABLES
    downgrade(database.engine)  # one step: 0011 -> 0010 drops the stored responses
    assert _tables(database) == TABLES_0010
    downgrade(database.engine)  # one step: 0010 -> 0009 drops the usage rollups and their triggers
    assert _tables(database) == TABLES_0009
    assert {i["name"] for i in inspect(database.engine).get_indexes("usage_records")} == usage_indexes
    downgrade(database.engine)  # one step: 0009 -> 0008 drops the adapter access lists
    assert _tables(database) == TABLES_0009 - {"lora_adapter_grants"}
    downgrade(database.engine)  # one step: 0008 -> 0007 drops prices, window budgets, spend columns
    assert _tables(database) == TABLES_0009 - NEW_IN_0008 - {"lora_adapter_grants"}
    usage_columns = {c["name"] for c in inspect(database.engine).get_columns("usage_records")}
    assert not usage_columns & {"spend_micros", "currency", "price_id"}
    assert {i["name"] for i in inspect(database.engine).get_indexes("usage_records")} == usage_indexes
    assert len(inspect(database.engine).get_foreign_keys("usage_records")) == 2
    downgrade(database.engine)  # 0007 -> 0006 drops the LoRA adapters and the usage column
    assert _tables(database) == TABLES_0009 - {"lora_adapters", "lora_adapter_grants"} - NEW_IN_0008
    assert "adapter" not in {c["name"] for c in inspect(database.engine).get_columns("usage_records")}
    assert {i["name"] for i in inspect(database.engine).get_indexes("usage_records")} == usage_indexes
    downgrade(database.engine)  # 0006 -> 0005 drops key limits, principal buckets, user, rpm
    assert (
        _tables(database)
        == TABLES_0009
        - {"key_limits", "principal_buckets", "lora_adapters", "lora_adapter_grants"}
        - NEW_IN_0008
    )
    assert "user" not in {c["name"] for c in inspect(database.engine).get_columns("usage_records")}
    assert "requests_per_minute" not in {c["name"] for c in inspect(database.engine).get_columns("quotas")}
    assert {i["name"] for i in inspect(database.engine).get_indexes("usage_records")} == usage_indexes
    assert len(inspect(database.engine).get_foreign_keys("usage_records")) == 2
    downgrade(database.engine)  # 0005 -> 0004 drops the model versions and the usage column
    assert _tables(database) == TABLES_0009 - {
        "model_versions",
        "model_traffic",
        "key_limits",
        "principal_buckets",
        "lora_adapters",
        *NEW_IN_0008,
        "lora_adapter_grants",
    }
    assert "model_version" not in {c["name"] for c in inspect(database.engine).get_columns("usage_records")}
    # SQLite rebuilds the table to drop a column: its indexes and foreign keys must survive.
    assert {i["name"] for i in inspect(database.engine).get_indexes("usage_records")} == usage_indexes
    assert len(inspect(database.engine).get_foreign_keys("usage_records")) == 2
    downgrade(database.engine)  # 0004 -> 0003 drops the quota's default reservation
    assert "default_max_tokens_reservation" not in {
        c["name"] for c in inspect(database.engine).get_columns("quotas")
    }
    downgrade(database.engine)  # 0003 -> 0002 drops the unique usage index
    assert _tables(database) == TABLES_0009 - {
        "model_versions",
        "model_traffic",
        "key_limits",
        "principal_buckets",
        "lora_adapters",
        *NEW_IN_0008,
        "lora_adapter_grants",
    }
    assert "ux_usage_records_request_tenant" not in {
        i["name"] for i in inspect(database.engine).get_indexes("usage_records")
    }
    downgrade(database.engine)  # 0002 -> 0001 drops the budget buckets
    assert _tables(database) == TABLES_0009 - {
        "budget_buckets",
        "model_versions",
        "model_traffic",
        "key_limits",
        "principal_buckets",
        "lora_adapters",
        *NEW_IN_0008,
        "lora_adapter_grants",
    }
    downgrade(database.engine)  # 0001 -> base
    assert _tables(database) == set()


def test_migrated_schema_matches_the_models(migrated: Database) -> None:
    with migrated.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_check_migrated_names_the_command(database: Database) -> None:
    with pytest.raises(MigrationRequiredError, match="weir db upgrade") as info:
        check_migrated(database.engine)
    assert info.value.current is None
    upgrade(database.engine)
    check_migrated(database.engine)
    downgrade(database.engine, "base")
    with pytest.raises(MigrationRequiredError, match="weir db upgrade"):
        check_migrated(database.engine)


def test_messages_mask_the_database_password() -> None:
    shown = safe_url("postgresql+psycopg://weir:hunter2@db.internal:5432/weir")
    assert "hunter2" not in shown
    assert "db.internal" in shown


def test_usage_rows_survive_0005_up_and_down(database: Database) -> None:
    """0005 adds a column to usage_records (SQLite rebuilds the table to drop it): rows stay."""
    upgrade(database.engine, "0004")
    with database.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tenants (id, name, status, priority, weight, cache_scope, created_at, updated_at) "
                "VALUES (1, 'acme', 'active', 'standard', 1.0, 'acme', :t, :t)"
            ),
            {"t": WHEN},
        )
        conn.execute(
            text(
                "INSERT INTO usage_records (request_id, tenant_id, key_id, model, prompt_tokens, "
                "completion_tokens, cached_tokens, status, created_at, day) "
                "VALUES ('r1', 1, NULL, 'smol', 5, 7, 0, 'completed', :t, :d)"
            ),
            {"t": WHEN, "d": WHEN.date()},
        )
    upgrade(database.engine, "0005")
    with database.engine.begin() as conn:
        rows = conn.execute(text("SELECT request_id, model, model_version FROM usage_records")).all()
        assert [tuple(r) for r in rows] == [("r1", "smol", None)]  # written before versions existed
        conn.execute(
            text(
                "INSERT INTO usage_records (request_id, tenant_id, key_id, model, model_version, prompt_tokens, "
                "completion_tokens, cached_tokens, status, created_at, day) "
                "VALUES ('r2', 1, NULL, 'smol', 'smol@v2', 1, 1, 0, 'completed', :t, :d)"
            ),
            {"t": WHEN, "d": WHEN.date()},
        )
    downgrade(database.engine)
    with database.engine.connect() as conn:
        rows = conn.execute(text("SELECT request_id, completion_tokens FROM usage_records ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("r1", 7), ("r2", 1)]
    with database.engine.begin() as conn, pytest.raises(IntegrityError):
        # The unique (request_id, tenant_id) index came back with the rebuilt table.
        conn.execute(
            text(
                "INSERT INTO usage_records (request_id, tenant_id, key_id, model, prompt_tokens, "
                "completion_tokens, cached_tokens, status, created_at, day) "
                "VALUES ('r1', 1, NULL, 'smol', 1, 1, 0, 'completed', :t, :d)"
            ),
            {"t": WHEN, "d": WHEN.date()},
        )


_POPULATE_0005 = [
    "INSERT INTO tenants (id, name, status, priority, weight, cache_scope, created_at, updated_at) "
    "VALUES (1, 'acme', 'active', 'standard', 1.0, 'acme', :t, :t)",
    "INSERT INTO quotas (tenant_id, tokens_per_minute, tokens_per_day, max_concurrent, max_prompt_tokens, "
    "max_output_tokens, models, ttft_slo_ms, tpot_slo_ms, default_max_tokens_reservation, updated_at) "
    "VALUES (1, 1000, 50000, 4, 2048, 512, '[\"smol\"]', 500, NULL, 64, :t)",
    "INSERT INTO api_keys (id, tenant_id, secret_hash, scopes, created_at, expires_at, revoked_at, last_used_at) "
    "VALUES ('k1', 1, 'h', '[\"inference\"]', :t, NULL, NULL, :t)",
    "INSERT INTO usage_records (request_id, tenant_id, key_id, model, model_version, prompt_tokens, "
    "completion_tokens, cached_tokens, ttft_ms, e2e_ms, status, finish_reason, created_at, day) "
    "VALUES ('r1', 1, 'k1', 'smol', 'smol@v1', 5, 7, 2, 1.5, 9.0, 'completed', 'stop', :t, :d)",
    "INSERT INTO audit_events (created_at, actor, action, tenant, target, details) "
    "VALUES (:t, 'cli', 'key.issue', 'acme', 'k1', '{}')",
    "INSERT INTO budget_buckets (tenant_id, tokens, refilled_at, day, day_used) VALUES (1, 12.5, 100.0, 3, 77)",
    "INSERT INTO model_versions (id, name, version, path, tokenizer, dtype, kv_cache_tokens, state, "
    "failure_reason, created_at, updated_at, updated_by) "
    "VALUES (1, 'smol', 'v1', '/w', NULL, NULL, NULL, 'active', NULL, :t, :t, 'cli')",
]
_SNAPSHOT_TABLES = (
    "tenants", "quotas", "api_keys", "usage_records", "audit_events", "budget_buckets", "model_versions",
)  # fmt: skip


_ADDED_AFTER_0005 = {
    "user",
    "requests_per_minute",
    "adapter",
    "spend_micros",
    "currency",
    "price_id",
    "endpoint",
    "response_storage_bytes",
    "response_retention_s",
}


_ADDED_IN_0013 = {"response_storage_bytes", "response_retention_s"}


def _snapshot(database: Database) -> dict[str, list[dict[str, object]]]:
    """Every row of the tables of 0005, the columns of 0005 only, as the database returns them."""
    out: dict[str, list[dict[str, object]]] = {}
    with database.engine.connect() as conn:
        for table in _SNAPSHOT_TABLES:
            rows = conn.execute(text(f"SELECT * FROM {table} ORDER BY 1")).mappings().all()
            out[table] = [{k: v for k, v in r.items() if k not in _ADDED_AFTER_0005} for r in rows]
    return out


def test_a_populated_0005_database_upgrades_to_head_and_back_with_nothing_lost(database: Database) -> None:
    """Today's data (every table of 0005 holding rows) survives 0006 and 0007 up, and down again."""
    upgrade(database.engine, "0005")
    with database.engine.begin() as conn:
        for stmt in _POPULATE_0005:
            conn.execute(text(stmt), {"t": WHEN, "d": WHEN.date()})
    before = _snapshot(database)
    assert all(before[t] for t in _SNAPSHOT_TABLES)
    upgrade(database.engine)
    assert _snapshot(database) == before
    with database.engine.connect() as conn:
        assert conn.execute(text('SELECT "user" FROM usage_records')).scalar_one() is None
        assert conn.execute(text("SELECT requests_per_minute FROM quotas")).scalar_one() is None
        assert conn.execute(text("SELECT count(*) FROM key_limits")).scalar_one() == 0
        assert conn.execute(text("SELECT adapter FROM usage_records")).scalar_one() is None
        stored = text("SELECT response_storage_bytes, response_retention_s FROM quotas")
        assert tuple(conn.execute(stored).one()) == (None, None)  # 0013: the server's defaults
    downgrade(database.engine, "0005")
    assert _snapshot(database) == before


_POPULATE_0007 = [
    "INSERT INTO admin_tokens (id, token_hash, created_at) VALUES (1, 'th', :t)",
    "INSERT INTO model_traffic (name, split, pins, updated_at, updated_by) "
    "VALUES ('smol', '{\"v1\": 100}', '{}', :t, 'cli')",
    "INSERT INTO key_limits (key_id, requests_per_minute, tokens_per_minute, tokens_per_day, max_concurrent, "
    "max_prompt_tokens, max_output_tokens, models, updated_at) VALUES ('k1', 10, 100, NULL, 2, NULL, NULL, '[]', :t)",
    "INSERT INTO principal_buckets (subject, tokens, refilled_at, day, day_used) VALUES ('key:k1:tokens', 3.5, 9.0, 4, 8)",
    "INSERT INTO lora_adapters (id, name, model_version, path, owner_tenant_id, state, failure_reason, created_at, "
    "updated_at, updated_by) VALUES (1, 'sql', 'smol@v1', '/a', 1, 'registered', NULL, :t, :t, 'cli')",
    "INSERT INTO usage_records (request_id, tenant_id, key_id, model, model_version, prompt_tokens, "
    'completion_tokens, cached_tokens, ttft_ms, e2e_ms, status, finish_reason, created_at, day, "user", adapter) '
    "VALUES ('r2', 1, 'k1', 'smol', 'smol@v1', 3, 4, 0, 2.5, 8.0, 'completed', 'length', :t, :d, 'u-1', 'sql')",
]


def test_a_populated_0007_database_upgrades_to_0008_and_back_with_nothing_lost(database: Database) -> None:
    """Today's schema (0007) with every table holding rows: 0008 up adds prices, spend columns
    (NULL on old records: they were never priced) and window budgets, and changes nothing else;
    0008 down gives the same rows back."""
    upgrade(database.engine, "0007")
    with database.engine.begin() as conn:
        for stmt in (*_POPULATE_0005, *_POPULATE_0007):
            conn.execute(text(stmt), {"t": WHEN, "d": WHEN.date()})
    tables = sorted(TABLES_0009 - NEW_IN_0008 - {"lora_adapter_grants"})

    def snapshot() -> dict[str, list[dict[str, object]]]:
        with database.engine.connect() as conn:
            return {
                t: [
                    {
                        k: v
                        for k, v in r.items()
                        if k not in {"spend_micros", "currency", "price_id", "endpoint"} | _ADDED_IN_0013
                    }
                    for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1")).mappings().all()
                ]
                for t in tables
            }

    before = snapshot()
    assert all(before[t] for t in tables)
    upgrade(database.engine)
    assert snapshot() == before
    with database.engine.connect() as conn:
        spends = conn.execute(
            text("SELECT spend_micros, currency, price_id, endpoint FROM usage_records")
        ).all()
        assert [tuple(r) for r in spends] == [(None, None, None, None), (None, None, None, None)]
        for table in NEW_IN_0008:
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 0
    downgrade(database.engine, "0007")
    assert snapshot() == before


def test_0010_backfills_the_rollups_from_the_records_and_keeps_them(database: Database) -> None:
    """Records written before 0010 are in the rollups after it; records written after it too."""
    upgrade(database.engine, "0009")
    with database.engine.begin() as conn:
        for stmt in (*_POPULATE_0005, *_POPULATE_0007):
            conn.execute(text(stmt), {"t": WHEN, "d": WHEN.date()})
    upgrade(database.engine)
    totals = "SELECT SUM(requests), SUM(completed), SUM(prompt_tokens), SUM(completion_tokens), SUM(unpriced) FROM "
    records = (
        "SELECT COUNT(*), SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END), SUM(prompt_tokens), "
        "SUM(completion_tokens), COUNT(*) FROM usage_records"
    )
    with database.engine.begin() as conn:
        expected = tuple(int(v) for v in conn.execute(text(records)).one())
        assert expected[0] == 2
        for table in ROLLUPS:
            assert tuple(int(v) for v in conn.execute(text(totals + table)).one()) == expected
        assert conn.execute(
            text('SELECT "user", null_mask FROM usage_daily_users ORDER BY null_mask')
        ).all() == [
            ("u-1", 8),  # no currency (never priced)
            ("", 16 + 8 + 4),  # 0005's record: no user, no currency, no adapter
        ]
        conn.execute(text("UPDATE usage_records SET prompt_tokens = prompt_tokens + 1000"))
        expected = (expected[0], expected[1], expected[2] + 2000, *expected[3:])
        for table in ROLLUPS:
            assert tuple(int(v) for v in conn.execute(text(totals + table)).one()) == expected
