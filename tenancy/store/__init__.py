"""The ground floor: engine and sessions, the SQLAlchemy tables, stored enums, the audit log, field rules."""
