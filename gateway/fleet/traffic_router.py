"""Which version of a model serves a new request: tenant pin first, else the weighted split.

Torch-free and stateless: the fleet passes the plan and the versions that may take new
requests (ready, in the order they became ready), and the request's id. The choice is a pure
function of those, so it is sticky for a request id and testable; the gateway makes it once per
HTTP request and keeps the request on that version for its whole life (every choice, every
token). Draining, retired, failed and loading versions are never in `routable`, so they never
get a new request whatever the plan says.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

# Percent points: a split is integers that sum to 100 (weir.tenancy.catalog.model_version_records.TrafficPlan).
_BUCKETS = 10_000


@dataclass(frozen=True)
class RoutePlan:
    """A model name's traffic plan as the router reads it: version label -> percent, tenant -> label."""

    split: Mapping[str, int] = field(default_factory=dict)
    pins: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", MappingProxyType(dict(self.split)))
        object.__setattr__(self, "pins", MappingProxyType(dict(self.pins)))
        for version, percent in self.split.items():
            if isinstance(percent, bool) or not isinstance(percent, int) or percent < 0:
                raise ValueError(f"split[{version!r}] must be an integer >= 0, got {percent!r}")


def request_bucket(request_id: str) -> int:
    """A stable number in [0, 10000) for a request id (the same id always lands in the same bucket)."""
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % _BUCKETS


def choose_version(plan: RoutePlan, routable: Sequence[str], tenant_id: str, request_id: str) -> str | None:
    """The version label for a new request, or None when no version may take it.

    1. The tenant's pin, if that version is routable.
    2. The split over its routable versions with a share, weighted by percent (renormalised over
       those, so a drained version's share goes to the others), chosen by `request_bucket`.
    3. Else the routable version that became ready last (a plan naming no ready version must not
       turn traffic away while one serves).
    """
    if not routable:
        return None
    ready = set(routable)
    pinned = plan.pins.get(tenant_id)
    if pinned is not None and pinned in ready:
        return pinned
    weighted = [(v, p) for v, p in sorted(plan.split.items()) if p > 0 and v in ready]
    total = sum(p for _, p in weighted)
    if total:
        point = request_bucket(request_id) * total / _BUCKETS
        upto = 0
        for version, percent in weighted:
            upto += percent
            if point < upto:
                return version
        return weighted[-1][0]
    return routable[-1]
