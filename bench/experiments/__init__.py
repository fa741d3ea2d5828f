"""One-off experiments, each answering one question of one issue; run with `python -m weir_bench.experiments.NAME`.

The `weir bench` commands (bench/cli.py) are the general tools: serve, gen, compare, overhead,
offline. An experiment here starts its own servers or engines, sets up its own tenants and
traffic, and writes a summary against its issue's targets:

- `noisy_neighbor`: one noisy tenant against a quiet one, admission on and off;
- `prefix_cache`: one workload with the prefix cache on and off, and a cross-tenant timing probe;
- `attacker`: a tenant's steady traffic alone and while another tenant sends hostile inputs;
- `soak`: mixed and hostile traffic against `weir serve` for minutes (`make soak`);
- `db_outage`: usage records across a database outage under load.

docs/benchmarks.md gives each command and its latest figures.
"""
