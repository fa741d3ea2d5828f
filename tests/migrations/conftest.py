"""The tenancy tests' database fixtures (SQLite, and PostgreSQL when configured), for the migrations."""

from tests.tenancy.conftest import database, db_url, migrated

__all__ = ["database", "db_url", "migrated"]
