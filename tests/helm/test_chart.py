"""Static checks of the Helm chart in helm/weir (no `helm` binary is needed).

The templates are Go templates, so they are checked as text: every `.Values` path they read
exists in values.yaml, every `include` names a defined helper, blocks are balanced, and what
they hand to Weir (WEIR_* variables, `weir` flags, probe paths) is what the code accepts. Where
a template's literal parts form YAML, its skeleton (actions removed) must parse.
values.schema.json: test_values_schema.py.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import build_parser
from gateway.settings import Settings
from tests.helm.chart_files import (
    CHART,
    COMMENT,
    HELPERS,
    ROOT,
    TEMPLATES,
    chart_values,
    lookup,
    read,
    template_files,
    templates,
)

ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)
VALUES_PATH = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
INCLUDE = re.compile(r"\b(?:include|template)\s+\"([^\"]+)\"")
DEFINE = re.compile(r"\{\{-?\s*define\s+\"([^\"]+)\"")
WEIR_ENV = re.compile(r"\bWEIR_[A-Z0-9_]+\b")
OPENERS = frozenset({"if", "range", "with", "define", "block"})
# Non-WEIR variables the chart sets itself (HOME: the root filesystem is read-only).
ALLOWED_OTHER_ENV = frozenset({"HOME"})


def _settings_env_names() -> set[str]:
    return set(re.findall(r"\"(WEIR_[A-Z0-9_]+)\"", read(ROOT / "gateway" / "settings.py")))


def _camel_to_env(key: str) -> str:
    return "WEIR_" + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper()


# -- Chart.yaml and values.yaml ---------------------------------------------------------------------


def test_chart_yaml_has_required_fields() -> None:
    chart = yaml.safe_load(read(CHART / "Chart.yaml"))
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "weir" == CHART.name
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?", str(chart["version"]))
    assert chart["description"]
    # The default image tag is the appVersion: keep it the project's version.
    project = tomllib.loads(read(ROOT / "pyproject.toml"))["project"]
    assert chart["appVersion"] == project["version"]


def test_values_yaml_has_the_groups_templates_need() -> None:
    values = chart_values()
    for key in (
        "replicaCount",
        "image",
        "config",
        "secrets",
        "database",
        "persistence",
        "probes",
        "resources",
        "gpu",
        "service",
        "shutdown",
        "serviceAccount",
    ):
        assert key in values, key
    assert values["replicaCount"] == 1
    assert values["database"]["type"] == "sqlite"
    assert values["image"]["repository"]


# -- .Values paths, includes, blocks ----------------------------------------------------------------


def test_every_values_path_in_templates_exists_in_values_yaml() -> None:
    values = chart_values()
    missing = []
    for name, text in templates().items():
        for match in VALUES_PATH.finditer(text):
            dotted = match.group(1).lstrip(".")
            try:
                lookup(values, dotted)
            except KeyError as exc:
                missing.append(f"{name}: .Values.{dotted} (no {exc.args[0]})")
    assert not missing, "\n".join(missing)


def test_every_values_key_is_read_by_some_template() -> None:
    used = {m.group(1).lstrip(".") for text in templates().values() for m in VALUES_PATH.finditer(text)}
    values = chart_values()
    unused = [key for key in values if not any(u == key or u.startswith(key + ".") for u in used)]
    unused += [f"config.{key}" for key in values["config"] if not any(u == f"config.{key}" for u in used)]
    assert not unused, f"values nobody reads: {unused}"


def _defined_helpers() -> set[str]:
    return set(DEFINE.findall(COMMENT.sub("", read(HELPERS))))


def test_every_include_names_a_helper_defined_in_helpers_tpl() -> None:
    defined = _defined_helpers()
    undefined = [
        f"{name}: {ref}"
        for name, text in templates().items()
        for ref in INCLUDE.findall(text)
        if ref not in defined
    ]
    assert not undefined, undefined
    # No other file defines helpers, and none is defined twice.
    for name, text in templates().items():
        names = DEFINE.findall(text)
        assert name == HELPERS.name or not names, f"{name} defines {names}"
        assert len(names) == len(set(names)), names


def test_every_helper_is_used() -> None:
    used = {ref for text in templates().values() for ref in INCLUDE.findall(text)}
    assert _defined_helpers() - used == set()


def block_errors(text: str) -> list[str]:
    """Problems with if/range/with/define/block ... end nesting in a template."""
    errors: list[str] = []
    stack: list[str] = []
    for match in ACTION.finditer(COMMENT.sub("", text)):
        words = match.group(1).split()
        if not words:
            continue
        keyword = words[0]
        line = text.count("\n", 0, match.start()) + 1
        if keyword in OPENERS:
            stack.append(f"{keyword} (line {line})")
        elif keyword == "end":
            if not stack:
                errors.append(f"line {line}: end without an open block")
            else:
                stack.pop()
        elif keyword == "else":
            if not stack or stack[-1].split()[0] not in {"if", "with", "range"}:
                errors.append(f"line {line}: else outside if/with/range")
    errors += [f"{opened} is never closed" for opened in stack]
    return errors


def test_block_counter_finds_unbalanced_templates() -> None:
    assert block_errors("{{- if .a }}x{{- else if .b }}y{{ else }}z{{- end }}") == []
    assert block_errors("{{ range .a }}{{ with .b }}{{ end }}{{ end }}{{/* {{ if }} */}}") == []
    assert block_errors("{{- if .a }}{{ with .b }}{{ end }}") == ["if (line 1) is never closed"]
    assert block_errors("{{ end }}") == ["line 1: end without an open block"]
    assert block_errors('{{ define "x" }}{{ else }}{{ end }}') == ["line 1: else outside if/with/range"]


@pytest.mark.parametrize("path", template_files(), ids=lambda p: p.name)
def test_template_blocks_are_balanced(path: Path) -> None:
    assert block_errors(read(path)) == []


# -- the YAML skeleton ------------------------------------------------------------------------------


def skeleton(text: str) -> str:
    """The template with actions removed: action-only lines dropped, inline actions -> X."""
    lines = []
    for line in COMMENT.sub("", text).splitlines():
        if line.strip() and not ACTION.sub("", line).strip():
            continue
        lines.append(ACTION.sub("X", line))
    return "\n".join(lines)


def _skeleton_docs(name: str) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(skeleton(read(TEMPLATES / name))) if doc is not None]
    assert all(isinstance(doc, dict) for doc in docs), name
    return docs


@pytest.mark.parametrize("path", [p for p in template_files() if p.suffix == ".yaml"], ids=lambda p: p.name)
def test_template_skeleton_is_yaml_with_kind(path: Path) -> None:
    docs = _skeleton_docs(path.name)
    assert docs
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), path.name
        assert "name" in doc["metadata"]


def _deployment() -> dict[str, Any]:
    (doc,) = _skeleton_docs("deployment.yaml")
    assert doc["kind"] == "Deployment"
    return doc


def test_deployment_shape() -> None:
    spec = _deployment()["spec"]["template"]["spec"]
    (server,) = spec["containers"]
    assert server["command"] == ["weir"]
    assert [p["name"] for p in server["ports"]] == ["http", "metrics"]
    assert {"startupProbe", "livenessProbe", "readinessProbe", "lifecycle", "resources"} <= set(server)
    assert {v["name"] for v in spec["volumes"]} >= {"data", "cache", "tmp"}
    assert {"nodeSelector", "tolerations", "terminationGracePeriodSeconds"} <= set(spec)


# -- what the chart hands to Weir -------------------------------------------------------------------


def test_env_names_are_ones_settings_reads() -> None:
    known = _settings_env_names()
    assert {"WEIR_PORT", "WEIR_ADMIN_TOKEN", "WEIR_KEY_PEPPER", "WEIR_DATABASE_URL"} <= known
    texts = {**templates(), "values.yaml": read(CHART / "values.yaml")}
    unknown = {
        f"{name}: {env}" for name, text in texts.items() for env in WEIR_ENV.findall(text) if env not in known
    }
    assert not unknown, sorted(unknown)


def test_literal_env_entries_are_known() -> None:
    known = _settings_env_names() | ALLOWED_OTHER_ENV
    for name in ("deployment.yaml", "migrate-job.yaml", "_helpers.tpl"):
        entries = re.findall(r"-\s+name:\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", read(TEMPLATES / name), re.M)
        # Container names (weir, migrate) and volume names (data, cache, tmp) are lowercase.
        env_names = [e for e in entries if e.isupper()]
        assert set(env_names) <= known, (name, set(env_names) - known)


def test_every_setting_can_be_set_through_the_chart() -> None:
    # Host and port are flags of the container's args; everything else is a variable.
    text = "".join(templates().values())
    missing = _settings_env_names() - {"WEIR_HOST", "WEIR_PORT"} - set(WEIR_ENV.findall(text))
    assert not missing, f"settings the chart cannot set: {sorted(missing)}"


def _config_env_pairs() -> list[tuple[str, str]]:
    """(variable, config key) pairs of the weir.configEnv helper; `$device` stands for
    `.Values.config.device` (which defaults to cuda with gpu.enabled)."""
    helper = read(HELPERS)
    pairs = []
    for env, key, var in re.findall(
        r"\(list \"(WEIR_[A-Z0-9_]+)\" (?:\.Values\.config\.([A-Za-z]+)|\$([A-Za-z]+))\)", helper
    ):
        if var:
            assert f"${var} := .Values.config.{var} " in helper, var
        pairs.append((env, key or var))
    return pairs


def test_config_keys_map_to_the_variable_of_the_same_name() -> None:
    pairs = _config_env_pairs()
    assert pairs
    for env, key in pairs:
        assert env == _camel_to_env(key), (key, env)
    assert {key for _, key in pairs} == set(chart_values()["config"]) - {"host", "port"}


def test_default_config_is_accepted_by_settings() -> None:
    """The variables the chart sets by default (and host/port flags) make valid Settings."""
    config = chart_values()["config"]
    env = {}
    for name, key in _config_env_pairs():
        value = config[key]
        if value is None or value == "":
            continue
        env[name] = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    settings = Settings.from_sources({"host": config["host"], "port": config["port"]}, env)
    assert str(settings.data_dir) == config["dataDir"]
    assert str(settings.cache_dir) == config["cacheDir"]
    assert settings.shutdown_grace_s == config["shutdownGraceS"]
    assert settings.auth_mode.value == "keys"  # a public bind requires API keys


def test_secret_keys_default_to_the_variable_names() -> None:
    keys = chart_values()["secrets"]["keys"]
    assert keys == {
        "adminToken": "WEIR_ADMIN_TOKEN",
        "keyPepper": "WEIR_KEY_PEPPER",
        "databaseUrl": "WEIR_DATABASE_URL",
    }


def _app_routes() -> set[str]:
    return set(re.findall(r"Route\(\"(/[^\"]*)\"", read(ROOT / "gateway" / "app.py")))


def test_probe_paths_are_routes_of_the_app() -> None:
    routes = _app_routes()
    assert {"/health", "/ready", "/metrics"} <= routes
    server = _deployment()["spec"]["template"]["spec"]["containers"][0]
    probes = {
        kind: server[kind]["httpGet"]["path"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {"startupProbe": "/ready", "livenessProbe": "/health", "readinessProbe": "/ready"}
    scraped = re.findall(r"path:\s*(/\S*)", read(TEMPLATES / "servicemonitor.yaml"))
    assert scraped == ["/metrics"]


# -- /metrics and /admin stay with the operator (issue 10, defect 7) --------------------------------


def test_metrics_have_their_own_port_which_the_service_monitor_scrapes() -> None:
    values = chart_values()
    assert values["config"]["metricsPort"] == Settings().metrics_port == 9464
    assert ("WEIR_METRICS_PORT", "metricsPort") in _config_env_pairs()
    (service,) = _skeleton_docs("service.yaml")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "metrics"]
    assert service["spec"]["ports"][1]["targetPort"] == "metrics"
    (monitor,) = _skeleton_docs("servicemonitor.yaml")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    # The metrics port is declared only when set, and a ServiceMonitor without it is refused.
    for name in ("deployment.yaml", "service.yaml"):
        text = read(TEMPLATES / name)
        assert text.index("{{- if .Values.config.metricsPort }}") < text.index("name: metrics"), name
    validate = read(HELPERS).split('define "weir.validate"')[1].split("{{- end -}}\n\n")[0]
    assert "metrics.serviceMonitor needs config.metricsPort" in validate
    assert "config.metricsPort must differ from config.port" in validate


def test_ingress_routes_only_the_api_by_default() -> None:
    values = chart_values()
    assert values["ingress"]["publishAdmin"] is False
    paths = [p["path"] for host in values["ingress"]["hosts"] for p in host["paths"]]
    assert paths == ["/v1"]
    text = read(TEMPLATES / "ingress.yaml")
    # Paths that would publish /metrics or /admin ("/" covers both) fail the render.
    guard = text.split("{{- range .paths }}")[1].split("{{- end }}")[0]
    for check in ('(eq .path "/")', '(hasPrefix "/metrics" .path)', '(hasPrefix "/admin" .path)', "fail"):
        assert check in guard, check
    # The one literal path is /admin/v1, inside the publishAdmin switch.
    assert re.findall(r"- path: (/\S*)", text) == ["/admin/v1"]
    admin = text.split("{{- if $.Values.ingress.publishAdmin }}")[1].split("{{- end }}")[0]
    assert "- path: /admin/v1" in admin
    # Every backend is the API port: the metrics port is never routed.
    assert re.findall(r"port:\s*\n\s*name: (\w+)", text) == ["http", "http"]


def _weir_args(text: str) -> Iterator[list[str]]:
    """The args lists of the containers whose command is `weir`, items as written."""
    pattern = re.compile(r"command:\s*\n\s*- weir\s*\n(\s*)args:\s*\n((?:\1\s+- .*\n)+)")
    for match in pattern.finditer(text):
        yield [line.strip()[2:].strip() for line in match.group(2).splitlines()]


def _resolve(item: str, values: dict[str, Any]) -> str:
    """An args item with its `.Values` reference replaced by the default value."""
    if "{{" not in item:
        return item
    found = VALUES_PATH.search(item)
    assert found, item
    value = lookup(values, found.group(1).lstrip("."))
    return str(int(value)) if isinstance(value, (int, float)) else str(value)


def _subparser(parser: argparse.ArgumentParser, names: list[str]) -> argparse.ArgumentParser:
    for name in names:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = actions[0].choices[name]
    return parser


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(subcommand words, options): the words before the first flag, then the rest."""
    first_flag = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    return argv[:first_flag], argv[first_flag:]


def _parse(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"weir rejects {argv}")


@pytest.mark.parametrize(
    ("name", "commands"),
    [("deployment.yaml", [["db", "upgrade"], ["serve"]]), ("migrate-job.yaml", [["db", "upgrade"]])],
    ids=["deployment", "migrate-job"],
)
def test_container_args_are_accepted_by_weir(name: str, commands: list[list[str]]) -> None:
    values = chart_values()
    argvs = [[_resolve(item, values) for item in items] for items in _weir_args(read(TEMPLATES / name))]
    assert [_split(argv)[0] for argv in argvs] == commands
    for argv in argvs:
        words, options = _split(argv)
        unknown = {arg for arg in options if arg.startswith("--")} - _flags(_subparser(build_parser(), words))
        assert not unknown, (name, unknown)
        assert callable(_parse(argv).func)


def test_serve_args_bind_every_interface_on_the_container_port() -> None:
    (serve,) = [items for items in _weir_args(read(TEMPLATES / "deployment.yaml")) if items[0] == "serve"]
    argv = [_resolve(item, chart_values()) for item in serve]
    args = _parse(argv)
    assert args.host == "0.0.0.0"
    assert args.port == chart_values()["config"]["port"]
    assert chart_values()["extraArgs"] == []


# -- rollout, shutdown and the optional objects -------------------------------------------------------


def test_shutdown_timing_defaults() -> None:
    values = chart_values()
    grace = values["config"]["shutdownGraceS"]
    assert values["shutdown"]["preStopSleepSeconds"] > 0
    assert values["shutdown"]["terminationGracePeriodSeconds"] is None  # derived by the helper
    helper = read(HELPERS)
    # preStop + ceil(grace) + 5 is the floor (checked), +10 more when derived.
    assert "add (int64 .Values.shutdown.preStopSleepSeconds) $grace 5" in helper
    assert "add $needed 10" in helper
    assert values["shutdown"]["preStopSleepSeconds"] + grace + 15 > grace + 10
    startup = values["probes"]["startup"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # first model preparation
    assert values["rollingUpdate"]["maxUnavailable"] == 0


def test_optional_objects_are_guarded() -> None:
    texts = templates()
    assert re.match(
        r"\s*\{\{- if eq \(include \"weir.createSecret\" \.\) \"true\" \}\}", texts["secret.yaml"]
    )
    assert "existingSecret" in read(HELPERS).split('define "weir.createSecret"')[1].split("end -}}")[0]
    assert (
        texts["pdb.yaml"]
        .lstrip()
        .startswith("{{- if and .Values.podDisruptionBudget.enabled (gt (int64 .Values.replicaCount) 1) }}")
    )
    assert texts["ingress.yaml"].lstrip().startswith("{{- if .Values.ingress.enabled }}")
    assert (
        texts["servicemonitor.yaml"].lstrip().startswith("{{- if .Values.metrics.serviceMonitor.enabled }}")
    )
    job = texts["migrate-job.yaml"]
    assert 'eq (include "weir.isPostgres" .) "true"' in job
    assert job.count("helm.sh/hook: pre-install,pre-upgrade") == 2  # the Job and its URL Secret
    assert "nvidia.com/gpu" == chart_values()["gpu"]["resourceName"]
    assert ".Values.gpu.resourceName" in texts["deployment.yaml"]


def test_readme_documents_every_value_the_templates_read() -> None:
    readme = read(CHART / "README.md")
    used = {m.group(1).lstrip(".") for text in templates().values() for m in VALUES_PATH.finditer(text)}
    undocumented = sorted(path for path in used if f"`{path}`" not in readme)
    assert not undocumented, undocumented
