"""The rules that keep a model served while its versions move: the database's operations (the
CLI on the records) and the running server's (`weir.gateway.fleet.model_rollout`, on the fleet) apply
the same ones.

- A model keeps a ready version: draining or retiring the last ready version of a model name is
  refused (`LastServingVersionError`, 409) unless forced; a forced one leaves the model answered
  503 `model_unavailable` until a version is ready again, never 404 as if it did not exist.
- A plan routes to ready versions only: a share or a pin on a version that is not ready is
  refused (`VersionNotReadyError`, 409 naming the entry), and a retired version leaves the stored split (the others' shares
  are scaled back up to 100) and the pins.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from weir.tenancy.catalog.model_version_records import TrafficPlan
from weir.tenancy.errors import LastServingVersionError, VersionNotReadyError
from weir.tenancy.store.enums import ModelVersionState


def check_keeps_serving(
    name: str, version: str, ready_versions: Collection[str], action: str, *, force: bool
) -> None:
    """Refuse to `action` (drain, retire) `version` when no other version of `name` is ready."""
    if force:
        return
    if not set(ready_versions) - {version}:
        raise LastServingVersionError(name, version, action)


def split_without(split: Mapping[str, int], version: str) -> dict[str, int]:
    """`split` with `version` taken out and the remaining shares scaled to sum to 100 again
    (largest remainder, ties to the first label); empty when no share is left."""
    kept = {v: p for v, p in split.items() if v != version}
    total = sum(kept.values())
    if total == 0:
        return {}
    if total == 100:
        return kept
    exact = {v: p * 100 / total for v, p in kept.items()}
    scaled = {v: int(x) for v, x in exact.items()}
    left = 100 - sum(scaled.values())
    for v in sorted(kept, key=lambda v: (-(exact[v] - scaled[v]), v))[:left]:
        scaled[v] += 1
    return scaled


def pins_without(pins: Mapping[str, str], version: str) -> dict[str, str]:
    """`pins` without the tenants pinned to `version` (they follow the split again)."""
    return {tenant: v for tenant, v in pins.items() if v != version}


def check_plan_serves(plan: TrafficPlan, states: Mapping[str, ModelVersionState]) -> None:
    """Refuse `plan` if a version with a share or a pin is not ready (`states`: by version label;
    a label it lacks is unknown, which the repository reports as not found)."""
    named = [(f"split.{v}", v) for v, p in sorted(plan.split.items()) if p > 0]
    named += [(f"pins.{t}", v) for t, v in sorted(plan.pins.items())]
    for field, version in named:
        state = states.get(version)
        if state is not None and state is not ModelVersionState.READY:
            raise VersionNotReadyError(plan.name, version, state.value, field)
