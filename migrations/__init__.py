"""Alembic migrations of the tenancy database; run them with `weir db upgrade`."""
