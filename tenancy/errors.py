"""Typed errors of the tenancy layer.

The gateway maps them to HTTP errors (`gateway/http/errors.py`); the CLI prints them. Nothing
here knows about HTTP.
"""

from __future__ import annotations


class TenancyError(Exception):
    """Base of every error the tenancy layer raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FieldError(TenancyError, ValueError):
    """An input field is missing, of the wrong type or out of range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class TenantNotFoundError(TenancyError):
    """No tenant has this name. `field` names the input that named it, when it was a field
    of a larger body (a traffic plan's pins)."""

    def __init__(self, name: str, field: str | None = None, why: str = "") -> None:
        where = f"{field}: " if field is not None else ""
        super().__init__(f"{where}tenant {name!r} not found{why}")
        self.name = name
        self.field = field


class TenantExistsError(TenancyError):
    """A tenant with this name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} already exists")
        self.name = name


class CacheScopeConflictError(TenancyError):
    """A tenant would join another tenant's prefix-cache scope without the admin asking to share.

    `field` names the input that collides (`cache_scope` or `name`).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class KeyNotFoundError(TenancyError):
    """No API key has this public id."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"API key {key_id!r} not found")
        self.key_id = key_id


class KeyInactiveError(TenancyError):
    """The operation needs an active key (e.g. rotation) but this one is revoked or expired."""

    def __init__(self, key_id: str, state: str) -> None:
        super().__init__(f"API key {key_id!r} is {state}; only an active key can be rotated")
        self.key_id = key_id
        self.state = state


class MigrationRequiredError(TenancyError):
    """The database schema is not at the revision this code needs; names the command to run."""

    def __init__(self, current: str | None, head: str, database: str) -> None:
        where = "has never been migrated" if current is None else f"is at revision {current}"
        super().__init__(
            f"the database {database} {where} but this version of Weir needs revision {head}; "
            "run `weir db upgrade` first"
        )
        self.current = current
        self.head = head


class ModelVersionNotFoundError(TenancyError):
    """No such model version (or, with `version` None, no version at all of this model name)."""

    def __init__(self, name: str, version: str | None = None) -> None:
        if version is None:
            super().__init__(f"model {name!r} has no registered version")
        else:
            super().__init__(f"model {name!r} has no version {version!r}")
        self.name = name
        self.version = version


class ModelVersionExistsError(TenancyError):
    """This (model name, version) is already registered; versions are never overwritten."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(f"model {name!r} already has a version {version!r}")
        self.name = name
        self.version = version


class InvalidModelTransitionError(TenancyError):
    """A model version cannot move from its state to the one asked for; names the allowed moves."""

    def __init__(
        self, name: str, version: str, current: str, new: str, allowed: list[str], *, why: str | None = None
    ) -> None:
        moves = ", ".join(allowed) if allowed else "none"
        because = why if why is not None else f"from {current} it can become: {moves}"
        super().__init__(
            f"model {name!r} version {version!r} is {current}; it cannot become {new} ({because})"
        )
        self.name = name
        self.version = version
        self.current = current
        self.new = new


class AdapterNotFoundError(TenancyError):
    """No such adapter, or one the asking tenant may not call: the message is the same."""

    def __init__(self, name: str) -> None:
        super().__init__(f"adapter {name!r} does not exist")
        self.name = name


class AdapterExistsError(TenancyError):
    """An adapter of this name is already registered (names are unique across the server)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"adapter {name!r} is already registered")
        self.name = name


class InvalidAdapterTransitionError(TenancyError):
    """An adapter cannot move from its state to the one asked for."""

    def __init__(self, name: str, current: str, new: str, allowed: list[str]) -> None:
        moves = ", ".join(allowed) if allowed else "none"
        super().__init__(f"adapter {name!r} is {current}; it cannot become {new} (from {current}: {moves})")
        self.name = name
        self.current = current
        self.new = new


class LastServingVersionError(TenancyError):
    """Draining or retiring this version would leave its model with no ready version: every
    request for the model would fail. Refused unless the operator forces it."""

    def __init__(self, name: str, version: str, action: str) -> None:
        super().__init__(
            f"model {name!r} has no other ready version than {version!r}; to {action} it would leave "
            f"{name!r} unserved (its requests answered 503 model_unavailable). Load and route another "
            "version first, or pass force to do it anyway"
        )
        self.name = name
        self.version = version
        self.action = action


class NameInUseError(TenancyError):
    """A model name, model version id or adapter name is already used by a thing of another kind:
    clients call all three by the same `model` field, so one name names one thing."""

    def __init__(self, name: str, taken_by: str) -> None:
        super().__init__(
            f"the name {name!r} is already used by {taken_by}; a client could not tell them apart"
        )
        self.name = name
        self.taken_by = taken_by


class VersionNotReadyError(TenancyError):
    """A traffic plan gives a share or a pin to a version that is not ready; `field` names the entry."""

    def __init__(self, name: str, version: str, state: str, field: str) -> None:
        super().__init__(
            f"{field}: model {name!r} version {version!r} is {state}; only ready versions take traffic"
        )
        self.name = name
        self.version = version
        self.state = state
        self.field = field
