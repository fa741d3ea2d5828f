"""`weir admin models ...` against the database and against a server (the same JSON either way)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.tenancy.model_admin_app import model_admin_app
from weir.migrations import cli  # the `db` and `admin` commands together
from weir.migrations.migrate import upgrade
from weir.tenancy.catalog.model_versions import ModelVersionRepo, ModelVersionState
from weir.tenancy.cli.admin_client import HttpAdmin
from weir.tenancy.cli.cli_support import CliError
from weir.tenancy.cli.model_cli import parse_pins, parse_split
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.audit import list_events
from weir.tenancy.store.db import Database, sqlite_url_for

TOKEN = "weir-admin-cli-test-token-0123456789"
# A load passes its own long timeout; Starlette's TestClient warns that it ignores timeouts.
pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Where:
    """A backend selected by command-line options, and the repository behind it."""

    def __init__(self, kind: str, options: list[str], repo: ModelVersionRepo) -> None:
        self.kind = kind
        self.options = options
        self.repo = repo


@pytest.fixture(params=["direct", "http"])
def where(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Where]:
    data = tmp_path / request.param
    assert run(capsys, "db", "upgrade", "--data-dir", str(data))[0] == 0
    db = Database(sqlite_url_for(data))
    repo = ModelVersionRepo(db)
    tenants = TenancyRepo(db, KeyHasher(b"pepper"))
    for name in ("acme", "beta"):  # what the plans pin
        tenants.create_tenant(TenantSpec(name), actor="test")
    if request.param == "direct":
        yield Where("direct", ["--data-dir", str(data)], repo)
    else:
        with TestClient(model_admin_app(repo), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            backend = HttpAdmin(client)
            monkeypatch.setattr(HttpAdmin, "connect", classmethod(lambda cls, url, token, **kw: backend))
            monkeypatch.setattr(HttpAdmin, "close", lambda self: None)
            yield Where("http", ["--server", "http://weir.test", "--admin-token", TOKEN], repo)
    db.dispose()


def _models(capsys: pytest.CaptureFixture[str], where: Where) -> Callable[..., Any]:
    def models(*argv: str, ok: bool = True) -> Any:
        code, out, err = run(capsys, "admin", "models", *argv, *where.options)
        if not ok:
            assert code != 0 and out == ""
            return err
        assert code == 0, err
        return json.loads(out)

    return models


def test_a_whole_rollout(where: Where, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = _models(capsys, where)
    weights = tmp_path / "weights"
    weights.mkdir()
    v1 = models("register", "smol", "v1", str(weights))
    assert (v1["id"], v1["state"], v1["dtype"], v1["kv_cache_tokens"]) == (
        "smol@v1",
        "registered",
        None,
        None,
    )
    v2 = models("register", "smol", "v2", str(weights), "--dtype", "bfloat16", "--kv-cache-tokens", "4096",
                "--tokenizer", str(weights))  # fmt: skip
    assert (v2["dtype"], v2["kv_cache_tokens"], v2["tokenizer"]) == ("bfloat16", 4096, str(weights))
    models("register", "other", "v1", str(weights))
    listed = models("list")
    assert [v["id"] for v in listed["data"]] == ["other@v1", "smol@v1", "smol@v2"]
    assert [v["id"] for v in models("list", "smol")["data"]] == ["smol@v1", "smol@v2"]

    for version in ("v1", "v2"):
        loaded = models("load", "smol", version)
        if where.kind == "direct":
            # On the database a load is only the intent; the next server start loads it.
            assert loaded["state"] == "loading"
            where.repo.set_state("smol", version, ModelVersionState.READY, actor="server start")
        else:
            assert loaded["state"] == "ready"

    plan = models("traffic", "smol", "--split", "v1=90, v2=10", "--pin", "acme=v1", "--pin", "beta=v2")
    assert plan == {"name": "smol", "split": {"v1": 90, "v2": 10}, "pins": {"acme": "v1", "beta": "v2"}}
    shares = {
        v["version"]: (v["traffic_percent"], v["pinned_tenants"]) for v in models("list", "smol")["data"]
    }
    assert shares == {"v1": (90, ["acme"]), "v2": (10, ["beta"])}
    assert models("list", "smol")["traffic"] == {
        "smol": {"split": {"v1": 90, "v2": 10}, "pins": plan["pins"]}
    }

    back = models("rollback", "smol", "--to", "v1")
    assert back == {"name": "smol", "split": {"v1": 100}, "pins": {"acme": "v1"}}
    assert models("list", "smol")["data"][1]["state"] == "draining"
    assert models("retire", "smol", "v2")["state"] == "retired"
    models("load", "smol", "v2")  # a retired version can be loaded again
    if where.kind == "direct":
        where.repo.set_state("smol", "v2", ModelVersionState.READY, actor="server start")
    models("traffic", "smol", "--split", "v2=100")
    assert models("drain", "smol", "v1")["state"] == "draining"
    assert where.repo.get("smol", "v1").state is ModelVersionState.DRAINING  # the same records either way

    with where.repo.db.transaction() as session:
        events = list_events(session, limit=3)
    assert [(e.action.value, e.target) for e in events] == [
        ("model.state", "smol@v1"),
        ("model.traffic", "smol"),
        ("model.state", "smol@v2"),
    ]
    assert events[0].actor == ("cli" if where.kind == "direct" else "admin-api test")


def test_refusals_are_one_line_errors(
    where: Where, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = _models(capsys, where)
    models("register", "smol", "v1", str(tmp_path))
    assert "already has a version 'v1'" in models("register", "smol", "v1", "/elsewhere", ok=False)
    assert "no version 'v9'" in models("drain", "smol", "v9", ok=False)
    assert "cannot become retired" in models("retire", "smol", "v1", ok=False)
    assert "no version 'v2'" in models("traffic", "smol", "--split", "v1=50,v2=50", ok=False)
    assert "sum to 100" in models("traffic", "smol", "--split", "v1=50", ok=False)
    assert "dtype" in models("register", "smol", "v2", "/w", "--dtype", "float64", ok=False)
    assert "name" in models("register", "org/smol", "v2", "/w", ok=False)
    assert "kv_cache_tokens" in models("register", "smol", "v2", "/w", "--kv-cache-tokens", "0", ok=False)
    assert "load it first" in models("rollback", "smol", "--to", "v1", ok=False)
    assert where.repo.get("smol", "v1").state is ModelVersionState.REGISTERED  # nothing changed


def test_a_failed_load_over_the_server_records_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    upgrade(db.engine)
    repo = ModelVersionRepo(db)
    with TestClient(model_admin_app(repo)) as client:
        backend = HttpAdmin(client)
        monkeypatch.setattr(HttpAdmin, "connect", classmethod(lambda cls, url, token, **kw: backend))
        monkeypatch.setattr(HttpAdmin, "close", lambda self: None)
        options = ["--server", "http://weir.test", "--admin-token", TOKEN]
        assert run(capsys, "admin", "models", "register", "smol", "v1", "/no/such/dir", *options)[0] == 0
        code, _, err = run(capsys, "admin", "models", "load", "smol", "v1", *options)
        assert code == 1 and "HTTP 422" in err and "/no/such/dir is not a directory" in err
        assert repo.get("smol", "v1").failure_reason == "weights path /no/such/dir is not a directory"
    db.dispose()


def test_a_database_command_refuses_a_server_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "admin", "models", "list", "--server", "http://127.0.0.1:9", "--data-dir", "/x"
    )
    assert code == 2 and "either --server or a database" in err
    code, _, err = run(capsys, "admin", "models", "list", "--server", "http://127.0.0.1:9")
    assert code == 2 and "--admin-token" in err


def test_split_and_pin_syntax() -> None:
    assert parse_split("v1=90,v2=10") == {"v1": 90, "v2": 10}
    assert parse_split(" v1 = 100 ,") == {"v1": 100}
    assert parse_split("") == {}
    for bad in ("v1", "v1=ninety", "=100", "v1=50,v1=50"):
        with pytest.raises(CliError):
            parse_split(bad)
    assert parse_pins(["acme=v1", "beta = v2"]) == {"acme": "v1", "beta": "v2"}
    for pins in (["acme"], ["=v1"], ["acme="], ["acme=v1", "acme=v2"]):
        with pytest.raises(CliError):
            parse_pins(pins)


def test_the_help_says_where_changes_take_effect(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["admin", "models", "load", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "next server start" in text and "--server" in text


def test_the_last_ready_version_moves_only_with_force(
    where: Where, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 54 finding 6: draining (then retiring) a model's only ready version needs --force."""
    models = _models(capsys, where)
    models("register", "smol", "v1", str(tmp_path))
    models("register", "smol", "v2", str(tmp_path))
    models("load", "smol", "v1")
    if where.kind == "direct":
        where.repo.set_state("smol", "v1", ModelVersionState.READY, actor="server start")
    assert "only ready versions take traffic" in models("traffic", "smol", "--split", "v2=100", ok=False)
    models("traffic", "smol", "--split", "v1=100")
    refused = models("drain", "smol", "v1", ok=False)
    assert "model 'smol' has no other ready version" in refused and "force" in refused
    assert where.repo.get("smol", "v1").state is ModelVersionState.READY
    assert models("drain", "smol", "v1", "--force")["state"] == "draining"
    assert "no other ready version" in models("retire", "smol", "v1", ok=False)
    assert models("retire", "smol", "v1", "--force")["state"] == "retired"
    assert where.repo.get_traffic("smol").split == {}  # the retired version left the split
