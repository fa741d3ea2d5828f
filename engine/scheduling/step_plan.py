"""What one step plans by the latency targets (engine/latency_targets.py): its time target, the
order in which running requests get tokens, and each tenant's share of the prefill budget.

- **Step target:** the tightest ITL target among the requests running now; with none (only
  batch work runs) the throughput-optimal target (`SchedulerConfig.target_step_s`, 800 ms on the
  CPU by default; None: the fixed budget). A step never plans to be longer than an ITL it owes,
  but where the goodput trade (engine/scheduling/slo_trade.py) finds that a longer one saves more first
  tokens than it breaks streams still meeting both targets.
- **Decodes:** by class, then least recently served first. Every decode of a class with an ITL
  target at least as tight as the step's goes; the others (looser classes, batch) fill what the
  step target leaves (`StepBudget.decode_capacity`) and the rest sit this step out, keeping their
  blocks. Least-recently-served first rotates those that wait, so none is left behind.
- **Prefill chunks:** by class, then by TTFT deadline (arrival + TTFT target: the request
  nearest its deadline first), then arrival. Waiting requests of a better class than a running
  prefill are admitted before that prefill gets its chunk (`Scheduler.schedule`).
- **Fair share within a class:** the prefill budget left for a class is divided between its
  tenants by weighted max-min fairness (water-filling, `fair_shares`): a tenant that wants less
  than its share keeps what it wants and the rest goes to the others in proportion to their
  weights. One tenant's n=16 or 8k-token prompts take their weight's share of each step, not all
  of it. Within a tenant the order above stands.
- **Fair share of decode rows within a class:** when a step's target holds fewer decode rows
  than run, the rows it holds are divided the same way (`fair_rows`): a tenant's beam 16 or
  n = 16 is 16 rows but gets its weight's share of the step's rows, the rest of its rows sit
  the step out (least recently served first within the tenant, so they rotate).
- **Fair share of seats and KV within a class:** a waiting request kept out by the running cap
  or by the KV pool may displace a running request of its own class when its tenant, with it,
  stays within its weighted share of what that class holds and another tenant is over its own
  (`share_victim`): beam 16 or n = 16 holding every seat, or long answers holding every block,
  cannot keep a tenant of the same class out. The victim is the over-share tenant's least
  advanced request that has run `min_residency_steps`.
- **A first answer before other tenants' rows:** a prompt whose last chunk is short (at most
  `FIRST_ANSWER_TOKENS`) runs its first-token step without the decode rows of same-class tenants
  that hold more rows in the step (decodes and prompt chunks) than its own tenant (by weight): a quiet tenant's chat does not pay for a
  neighbour's beam 16 in its TTFT (measured on SmolLM2: a 30-token prompt alone 46 ms, beside 16
  beam rows 72 ms). A row sits out so only when its ITL target still holds over this step and
  the next, and never two steps in a row (`first_answer_yields`).

Plain Python, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from weir.engine.request import Request

_NO_TARGET = math.inf
# The longest last prompt chunk whose step other tenants' decode rows may sit out (`first_answer_yields`).
FIRST_ANSWER_TOKENS = 64


def step_target_s(running: Iterable[Request], throughput_target_s: float | None) -> float | None:
    """The step's time target: the tightest ITL target running, else `throughput_target_s`."""
    tightest = min((r.latency.itl_s for r in running if r.latency.itl_s is not None), default=None)
    if tightest is None:
        return throughput_target_s
    return tightest if throughput_target_s is None else min(tightest, throughput_target_s)


def decode_key(req: Request) -> tuple[int, float]:
    """Order of decodes: class first, then the one whose last token is oldest."""
    last = req.times.token_s[-1] if req.times.token_s else req.arrival_s
    return (int(req.priority), last)


def owes_itl(req: Request, target_s: float | None) -> bool:
    """Whether the step's target is (at least) `req`'s own ITL target: its decode always goes."""
    itl = req.latency.itl_s
    return target_s is None or (itl is not None and itl <= target_s * 1.000001)


def prefill_key(req: Request) -> tuple[int, float, float]:
    """Order of prefill chunks: class, TTFT deadline (none: last), arrival."""
    ttft = req.latency.ttft_s
    deadline = req.arrival_s + ttft if ttft is not None else _NO_TARGET
    return (int(req.priority), deadline, req.arrival_s)


def ttft_tokens(prompts: Iterable[Request], now: float, step_s: float) -> int:
    """Prompt tokens a step of `step_s` must feed so that every prompt with a TTFT target can still
    finish by its deadline. Prompts are served in `prefill_key` order (class, then deadline), so a
    prompt finishes only after the ones before it: its need is the tokens left of it and of every
    prompt before it, over the steps left before its own deadline (at least one); the step must
    feed the most of any. A prompt past its deadline adds nothing, neither its own need nor its
    tokens to the later ones' (an overloaded machine would otherwise hold every step at the full
    chunk, past the ITL target, for TTFTs that are lost anyway: measured).

    The step budget's prefill floor does not shrink below this (up to its minimum chunk): a
    loaded CPU whose fitted overhead leaves a quarter of a 300 ms step for 3 tokens of prefill
    otherwise trickles a 70-token chat in over 20 steps, 6 s, while its ITL target is kept
    either way (measured on SmolLM2, docs/benchmarks.md). Counting the prompts before it matters
    when chats arrive together: three 70-token chats with 2 s to go need 35 tokens a step, not 12."""
    need = 0
    ahead = 0  # tokens left of the timed prompts served before this one
    for req in sorted(prompts, key=prefill_key):
        ttft = req.latency.ttft_s
        if ttft is None or req.num_remaining <= 1 or now >= req.arrival_s + ttft:
            continue  # no target, or missed already: not worth the running streams' ITL
        ahead += req.num_remaining
        steps_left = max(1, int((req.arrival_s + ttft - now) / step_s)) if step_s > 0 else 1
        need = max(need, -(-ahead // steps_left))
    return need


def fair_rows(decodes: Sequence[Request], capacity: int) -> list[Request]:
    """The decodes a step of `capacity` rows holds: better classes first; a class that does not
    fit whole is divided between its tenants by `fair_shares` (one row per decode, the tenant's
    weight), each tenant's rows least recently served first. Order: by class, then as given."""
    kept: list[Request] = []
    left = max(0, capacity)
    by_class: dict[int, list[Request]] = {}
    for r in decodes:
        by_class.setdefault(int(r.priority), []).append(r)
    for cls in sorted(by_class):
        group = by_class[cls]
        if len(group) <= left:
            kept += group
            left -= len(group)
            continue
        if left <= 0:
            break
        demands: dict[str, int] = {}
        weights: dict[str, float] = {}
        for r in group:
            demands[r.tenant_id] = demands.get(r.tenant_id, 0) + 1
            weights[r.tenant_id] = r.weight
        shares = fair_shares(left, demands, weights)
        chosen = {
            id(r)
            for tenant, share in shares.items()
            for r in sorted((r for r in group if r.tenant_id == tenant), key=decode_key)[:share]
        }
        kept += [r for r in group if id(r) in chosen]
        break
    return kept


def share_victim(
    head: Request,
    running: Iterable[Request],
    held_by: Callable[[Request], int],
    need: int,
    may_preempt: Callable[[Request], bool],
) -> Request | None:
    """A running request of `head`'s class to preempt so that `head`'s tenant gets its weighted
    share of what the class's running requests hold (`held_by`: seats, KV blocks), `head` taking
    `need` more. Only when `head`'s tenant stays within its share with it; from the tenant most
    over its own share per unit of weight, the least advanced request `may_preempt` allows.
    None when nobody else is over its share (or `head`'s tenant would be)."""
    same = [r for r in running if r.priority is head.priority]
    held: dict[str, int] = {}
    weights: dict[str, float] = {head.tenant_id: head.weight}
    for r in same:
        held[r.tenant_id] = held.get(r.tenant_id, 0) + held_by(r)
        weights[r.tenant_id] = r.weight
    total = sum(held.values()) + need
    total_weight = sum(weights.values())

    def share(tenant: str) -> float:
        return total * weights[tenant] / total_weight

    if held.get(head.tenant_id, 0) + need > share(head.tenant_id):
        return None
    over = [t for t in held if t != head.tenant_id and held[t] > share(t)]
    for tenant in sorted(over, key=lambda t: held[t] / weights[t], reverse=True):
        candidates = [r for r in same if r.tenant_id == tenant and held_by(r) > 0 and may_preempt(r)]
        if candidates:
            return min(candidates, key=lambda r: (r.num_computed_tokens, -r.arrival_s))
    return None


def fair_shares(budget: int, demands: Mapping[str, int], weights: Mapping[str, float]) -> dict[str, int]:
    """Weighted max-min fair integer shares of `budget` tokens for tenants wanting `demands`.

    No tenant gets more than it wants; the total is min(budget, total demand); a tenant that
    gets less than it wants has at least its weight's proportion of what is left after the
    tenants that are satisfied. Leftover units from rounding go by largest remainder.
    """
    shares = {t: 0 for t in demands}
    active = {t for t, d in demands.items() if d > 0}
    left = max(0, budget)
    while active and left > 0:
        total_w = sum(weights.get(t, 1.0) for t in active)
        ideal = {t: left * weights.get(t, 1.0) / total_w for t in active}
        capped = {t for t in active if demands[t] - shares[t] <= ideal[t]}
        if capped:  # these are satisfied outright; the rest is shared again among the others
            for t in capped:
                left -= demands[t] - shares[t]
                shares[t] = demands[t]
            active -= capped
            continue
        floors = {t: int(ideal[t]) for t in active}
        for t, n in floors.items():
            shares[t] += n
        rest = left - sum(floors.values())
        for t in sorted(active, key=lambda t: (ideal[t] - floors[t], weights.get(t, 1.0)), reverse=True)[
            :rest
        ]:
            shares[t] += 1
        break
    return shares


def first_answer_yields(
    firsts: Sequence[Request],
    decodes: Sequence[Request],
    sat_out_last_step: Collection[str],
    now: float,
    step_s: float,
    others: Sequence[Request] = (),
) -> list[Request]:
    """The decode rows of `decodes` that sit this step out so that the prompts of `firsts` (each
    ending this step with a chunk of at most `FIRST_ANSWER_TOKENS`) get their first token from
    a shorter step. A row yields to a first answer of its own class from another tenant that
    holds fewer rows in the step per unit of weight (its decodes, its prompt chunks, `others`:
    every other row scheduled), so the tenant with more rows yields, never the one with fewer: a
    tenant sending a stream of new short prompts holds a row for each and cannot push out
    another's lone decode. A row yields only when it did not sit out the last step, and when its
    ITL target holds over the time since its last streamed token (none for a beam) plus two
    steps of `step_s`."""
    rows: dict[tuple[int, str], int] = {}
    for r in (*decodes, *firsts, *others):
        key = (int(r.priority), r.tenant_id)
        rows[key] = rows.get(key, 0) + 1
    yields: list[Request] = []
    for d in decodes:
        if d.request_id in sat_out_last_step:
            continue
        itl = d.latency.itl_s
        # a row with output but no token streamed (a beam: its group answers at the end) owes no gap
        last = d.times.token_s[-1] if d.times.token_s else now
        if itl is not None and (now - last) + 2.0 * step_s > itl:
            continue
        held = rows[(int(d.priority), d.tenant_id)] / d.weight
        if any(
            f.priority is d.priority
            and f.tenant_id != d.tenant_id
            and rows[(int(f.priority), f.tenant_id)] / f.weight < held
            for f in firsts
        ):
            yields.append(d)
    return yields
