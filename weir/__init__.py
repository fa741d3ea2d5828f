"""The `weir` command: the composition root over gateway, tenancy, engine and (lazily) bench."""
