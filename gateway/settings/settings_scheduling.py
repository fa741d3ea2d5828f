"""The settings of what the engine runs when: batch and step sizes, the waiting queue and
admission, token budgets across replicas, and the prefix cache's share per tenant."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from weir.engine.config import QueuePolicy
from weir.gateway.settings.setting_field import setting


@dataclass(frozen=True)
class SchedulingFields:
    """Scheduling: steps, the waiting queue, admission, budgets and the prefix cache"""

    max_num_seqs: int = setting(64, "most sequences in one batch", ge=1)
    max_num_batched_tokens: int = setting(
        2048,
        "most tokens in one engine step",
        doc="most tokens in one engine step (prefill chunks + decodes)",
        ge=1,
    )
    # The per-step token budget and running cap follow this target step time and the measured costs
    # (engine/scheduling/step_budget.py); None: CPU_TARGET_STEP_MS on CPU, none on an accelerator.
    target_step_ms: float | None = setting(
        None,
        "target engine step time: the per-step token budget (up to --max-num-batched-tokens) and how "
        "many sequences run at once follow it and the measured costs; 0: none, a fixed budget",
        doc="target engine step time: each step's token budget (up to `--max-num-batched-tokens`) and how "
        'many sequences run at once follow it and the measured costs (see "Step budget" below); `0`: '
        "none, the fixed budget",
        default_text="800 on CPU, none on an accelerator",
        metavar="MS",
        ge=0,
        finite=True,
    )
    # Engine SchedulerConfig.admission_hold_s.
    admission_hold_ms: float = setting(
        0.0,
        "while sequences run, a new request waits up to MS (or until as many requests wait as run) so "
        "that prompts are prefilled together instead of one per step into every running stream's "
        "inter-token gaps: smoother streams for later first tokens; 0: admitted at once",
        doc="while sequences run, a new request waits up to this long, or until as many requests wait as "
        "run, before its prompt is admitted, so that prompts arriving apart are prefilled together "
        "instead of one per step into every running stream's inter-token gaps (TGI's "
        "`max_waiting_tokens` / `waiting_served_ratio`): smoother streams for later first tokens; an "
        "idle engine admits at once; `0`: always at once. Measured on SmolLM2 under guidellm's 8 "
        "closed-loop streams: `150` cut ITL p50 by ~25% (34-38 against 44-53 ms) and raised TTFT p50 by "
        "40-85% (1.33-1.35 against 0.73-0.95 s) ([benchmarks](benchmarks-history.md))",
        metavar="MS",
        ge=0,
        finite=True,
    )
    queue_policy: QueuePolicy = setting(
        QueuePolicy.FAIR,
        "waiting-queue order: fair = priority class, then per-tenant fair share",
        doc="waiting-queue order: `fcfs`, `priority`, or `fair` (priority class, then per-tenant fair share)",
    )
    admission: bool = setting(
        True,
        "on: token budgets, SLO-aware rejection, queue bound; off: admit everything",
        doc="token budgets, SLO-aware rejection, the queue bound; `off` admits everything",
    )
    max_queue_time_s: float = setting(
        300.0,
        "503 for a request still waiting in the queue after this; 0: no limit",
        doc="a request still waiting after this gets `503 deadline_exceeded`; `0`: no limit",
        ge=0,
    )
    max_queued_tokens: int = setting(
        65_536,
        "503 when waiting prompt tokens would exceed this; 0: no bound",
        doc="`503 queue_full` when waiting prompt tokens would exceed this; `0`: no bound",
        ge=0,
    )
    class_refuse_factor: float = setting(
        3.0,
        "503 an interactive request of a tenant without ttft_slo_ms when its predicted TTFT exceeds "
        "the class's target times this; 0: never",
        doc="`503 slo_unattainable` for an interactive request of a tenant without a `ttft_slo_ms` of its own "
        "when its predicted time to first token exceeds the interactive class's target times this "
        "(3: 6 s on a CPU); `0`: such requests are never refused on predictions",
        ge=0,
    )
    lease_tokens: int = setting(
        4096,
        "largest budget chunk a replica leases from PostgreSQL",
        doc="largest chunk of a tenant's budget one replica leases (PostgreSQL)",
        ge=1,
    )
    lease_ttl_s: float = setting(
        10.0,
        "unused leases return after this",
        doc="unused leased tokens go back to the database after this",
        gt=0,
    )
    default_max_tokens_reservation: int = setting(
        1024,
        "output tokens reserved per sequence for a request without max_tokens; usage beyond it is "
        "charged as debt",
        doc="output tokens reserved per sequence for a request without `max_tokens` (a tenant's quota may "
        "override it); use beyond it is charged as debt "
        "([token budgets](admin-api.md#token-budgets-reservations-and-debt))",
        ge=1,
    )
    prefix_caching: bool = setting(True, "reuse the KV blocks of identical prefixes, scoped per tenant")
    tenant_cache_share: float = setting(
        1.0,
        "most of the KV pool (0-1] one tenant's cached prefixes may hold",
        metavar="F",
        gt=0,
        le=1,
    )
