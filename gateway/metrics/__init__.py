"""Prometheus collectors, the metrics listener and tracing."""
