"""The repository facade over every tenancy resource: tenants, keys, quotas, usage, audit."""
