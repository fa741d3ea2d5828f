"""The admin API's request and response bodies, declared once as pydantic v2 models.

The HTTP routes (`weir.gateway.routes.admin`, `weir.gateway.routes.models_admin`) parse and render with
them, the CLI's clients (`weir.tenancy.cli.admin_client`, `weir.tenancy.cli.model_admin_client`) build requests and
read answers with them, and `/openapi.json`'s admin part is generated from them
(`weir.gateway.api.openapi_admin`). A validation error becomes a `FieldError` naming the field
(`weir.tenancy.parsing`: the admin API's 422/400). One module per resource:

- `fields`: the shared field types (times, tenant names, priorities);
- `quota`: the quota and key-limits bodies, derived from `weir.tenancy.quota_limits.QuotaLimits`;
- `tenants`, `keys`, `usage`, `audit`, `model_versions`, `usage_record`.
"""
