"""Static checks of the Helm chart's sources in helm/weir, the ones rendering cannot make: every
`.Values` path a template reads exists in values.yaml (Helm renders a missing one as empty, no
error), every value is read and documented, every `include` names a helper, every WEIR_* name is
one Settings reads and every setting can be set through the chart.

Rendering, lint and Kubernetes validation with Helm's own engine: test_render.py; what the
rendered objects say: test_rendered_objects.py; values.schema.json: test_values_schema.py.
"""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.helm.chart_files import (
    CHART,
    COMMENT,
    HELPERS,
    ROOT,
    TEMPLATES,
    chart_values,
    lookup,
    read,
    templates,
)
from weir.gateway.settings.settings import Settings, declared

VALUES_PATH = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
INCLUDE = re.compile(r"\b(?:include|template)\s+\"([^\"]+)\"")
DEFINE = re.compile(r"\{\{-?\s*define\s+\"([^\"]+)\"")
WEIR_ENV = re.compile(r"\bWEIR_[A-Z0-9_]+\b")
# Non-WEIR variables the chart sets itself (HOME: the root filesystem is read-only).
ALLOWED_OTHER_ENV = frozenset({"HOME"})


def _settings_env_names() -> set[str]:
    return {setting.env for setting in declared()}


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


# -- rollout, shutdown and the optional objects -------------------------------------------------------


def test_readme_documents_every_value_the_templates_read() -> None:
    readme = read(CHART / "README.md")
    used = {m.group(1).lstrip(".") for text in templates().values() for m in VALUES_PATH.finditer(text)}
    undocumented = sorted(path for path in used if f"`{path}`" not in readme)
    assert not undocumented, undocumented
