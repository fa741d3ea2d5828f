"""Window budgets as records: whose, in what unit, over which window, with which limits; and what
taking from them gives (charges, refusals, soft-limit alerts). `weir.tenancy.budgets.window_budgets` stores and
counts them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from weir.tenancy.budgets.budget_windows import WindowError, WindowKind, WindowSpec
from weir.tenancy.budgets.money import MAX_AMOUNT_MICROS
from weir.tenancy.errors import FieldError


class BudgetUnit(enum.StrEnum):
    TOKENS = "tokens"
    MICROS = "micros"


class BudgetNotFoundError(FieldError):
    """No window budget has this id."""

    def __init__(self, budget_id: int) -> None:
        super().__init__("budget_id", f"window budget {budget_id} not found")


def _limit(value: object, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_AMOUNT_MICROS:
        raise FieldError(field, f"must be null or an integer in [1, {MAX_AMOUNT_MICROS}]")
    return value


@dataclass(frozen=True)
class BudgetSpec:
    """A budget to set: whose (a tenant, or one of its keys), in what unit, over which window."""

    tenant: str
    key_id: str | None
    unit: BudgetUnit
    window: WindowSpec
    soft_limit: int | None = None
    hard_limit: int | None = None

    def __post_init__(self) -> None:
        _limit(self.soft_limit, "soft_limit")
        _limit(self.hard_limit, "hard_limit")
        if self.soft_limit is None and self.hard_limit is None:
            raise FieldError("hard_limit", "a budget needs a soft_limit, a hard_limit or both")
        if self.soft_limit is not None and self.hard_limit is not None and self.soft_limit > self.hard_limit:
            raise FieldError("soft_limit", "must not exceed hard_limit")


@dataclass(frozen=True)
class Budget:
    """A stored budget."""

    id: int
    tenant: str
    key_id: str | None
    unit: BudgetUnit
    window: WindowSpec
    soft_limit: int | None
    hard_limit: int | None


@dataclass(frozen=True)
class Charge:
    """An amount added to one bucket of one budget (a reservation, later settled)."""

    budget: Budget
    bucket_start: int
    amount: int


@dataclass(frozen=True)
class SoftAlert:
    """A window's count reached its budget's soft limit (first time in that window)."""

    budget: Budget
    used: int
    window_start: int


@dataclass(frozen=True)
class Refusal:
    """A hard limit refused: what was used, asked for, and how long until it could fit."""

    budget: Budget
    used: int
    requested: int
    reset_s: float  # until the current window is over
    retry_after_s: float | None  # None: larger than the limit itself; waiting cannot help


@dataclass(frozen=True)
class TakeResult:
    charges: tuple[Charge, ...]
    refusal: Refusal | None = None


def budget_details(budget: Budget) -> dict[str, object]:
    """A budget as the admin API and the audit log show it."""
    w = budget.window
    return {
        "id": budget.id,
        "tenant": budget.tenant,
        "key_id": budget.key_id,
        "unit": budget.unit.value,
        "window": w.kind.value,
        "time_zone": w.time_zone,
        "rolling_s": w.rolling_s,
        "soft_limit": budget.soft_limit,
        "hard_limit": budget.hard_limit,
    }


def window_spec(kind: str, time_zone: str = "UTC", rolling_s: int | None = None) -> WindowSpec:
    """A `WindowSpec` from admin input; a bad one as a `FieldError` naming the field."""
    try:
        window = WindowKind(kind)
    except ValueError:
        names = ", ".join(k.value for k in WindowKind)
        raise FieldError("window", f"must be one of {names}, got {str(kind)[:32]!r}") from None
    try:
        return WindowSpec(window, time_zone, rolling_s)
    except WindowError as exc:
        raise FieldError("time_zone" if "zone" in str(exc) else "rolling_s", str(exc)) from None
