"""weir_bench.weir_process.parse_gauges: the gauges a benchmark reads off a Weir /metrics page."""

from __future__ import annotations

from weir_bench.weir_process import parse_gauges

PAGE = """\
# HELP weir_scheduler_token_budget Tokens the scheduler allowed in the last step.
# TYPE weir_scheduler_token_budget gauge
weir_scheduler_token_budget{model_version="smol@default"} 272.0
# HELP weir_scheduler_max_running Sequences the target step time lets run at once.
# TYPE weir_scheduler_max_running gauge
weir_scheduler_max_running{model_version="smol@default"} 22.0
# HELP weir_requests_running Running requests.
# TYPE weir_requests_running gauge
weir_requests_running 3.0
# HELP weir_tenant_tokens Tokens per tenant.
# TYPE weir_tenant_tokens gauge
weir_tenant_tokens{tenant="acme",model_version="smol@default"} 9.0
"""


def test_per_engine_gauges_labelled_by_model_version_are_read() -> None:
    names = ("weir_scheduler_token_budget", "weir_scheduler_max_running", "weir_requests_running")
    assert parse_gauges(PAGE, names) == {
        "weir_scheduler_token_budget": 272.0,
        "weir_scheduler_max_running": 22.0,
        "weir_requests_running": 3.0,
    }


def test_samples_with_other_labels_and_unnamed_gauges_are_left_out() -> None:
    assert parse_gauges(PAGE, ("weir_tenant_tokens", "weir_missing")) == {}
