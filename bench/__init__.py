"""Benchmarks: the serving load generator (`weir bench serve`), report comparison, trace generators."""
