"""The database: engine and sessions, the SQLAlchemy tables, the repository, records and row mapping, enums, the audit log, migrations run from code."""
