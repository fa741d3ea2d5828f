"""Stored responses of `POST /v1/responses`: per tenant, counted in a quota, expiring."""
