"""The Helm chart's `config:` block (helm/weir), made from the settings' declarations: the values
with their comments (values.yaml), their schema (values.schema.json) and the ConfigMap's list of
`WEIR_*` variables (templates/_helpers.tpl).

Each non-secret setting is one key under `config:`, its variable's name in camelCase, unset (null
or "") unless the chart needs a value of its own; what only the chart says (the pod's side) is in
the tables below. `make settings-reference` rewrites the three places and
tests/gateway/settings/test_settings_reference.py fails while they differ.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Any

import annotated_types

from weir.gateway.settings.setting_field import DeclaredSetting

# Passed as the server container's flags (deployment.yaml), not through the ConfigMap.
CHART_FLAGS = ("host", "port")
# Values the chart sets itself; every other key is unset, so Weir's default applies.
CHART_VALUES: dict[str, Any] = {
    "host": "0.0.0.0",
    "port": 8000,
    "metricsPort": 9464,
    "dataDir": "/var/lib/weir",
    "cacheDir": "/var/cache/weir",
    "shutdownGraceS": 30,
}
# Keys the templates read themselves, so they may not be unset.
CHART_REQUIRED = ("host", "port", "dataDir", "cacheDir")
_NOT_NULL = (*CHART_REQUIRED, "metricsPort")  # the templates read null as 0: no metrics port
# Where the chart is stricter than Weir: a pod's port is never 0 (pick a free one); a draft
# model's path is never empty.
_SCHEMA_OVERRIDES: dict[str, dict[str, Any]] = {
    "port": {"minimum": 1},
    "speculative": {"pattern": "^(|off|ngram|draft:.+)$"},
}
# The ConfigMap's value where it is not `.Values.config.<key>` (`$device`: cuda with gpu.enabled).
_ENV_EXPRESSIONS = {"device": "$device"}
# What the chart adds to a setting's help: the pod's side of it.
CHART_NOTES = {
    "host": "Every interface inside the pod: API keys are then required unless config.auth says otherwise.",
    "port": "Also the container port.",
    "metricsPort": "The Service's `metrics` port that the ServiceMonitor scrapes and the Ingress never "
    "routes. The metrics name every tenant: on the API port /metrics needs the admin token.",
    "forwardedAllowIps": 'Set it to the ingress controller pods\' IPs or CIDRs, e.g. "10.0.0.0/8"; "" '
    "trusts none, so every client behind the ingress is seen as the ingress (valid API keys are never "
    "throttled either way).",
    "dataDir": "Mounted from persistence.data.",
    "cacheDir": "Mounted from persistence.cache.",
    "model": "A folder inside the pod (mount it with extraVolumes).",
    "device": "Empty with gpu.enabled: cuda.",
    "kvCacheTokens": "46,080 bytes per token for SmolLM2 in float32: size resources.limits.memory with it.",
    "hostKvCacheTokens": "It is RAM: size resources.limits.memory with it.",
    "adapterDir": "A folder inside the pod (mount it with extraVolumes).",
    "speculative": "A draft model's path is inside the pod.",
    "auth": "The pod binds a public address, so empty means keys.",
    "leaseTokens": 'How replicas share token budgets through PostgreSQL (README.md, "Budgets across replicas").',
    "otelEndpoint": "E.g. http://otel-collector:4318/v1/traces.",
    "shutdownGraceS": "The pod's terminationGracePeriodSeconds is derived from it (see shutdown below).",
}
_PAIR = '{{{{- $pairs = append $pairs (list "{env}" {value}) -}}}}'
_PAIR_LINE = re.compile(r'^\{\{- \$pairs = append \$pairs \(list "WEIR_[A-Z0-9_]+" \S+\) -\}\}$', re.M)


def chart_settings(declared: Sequence[DeclaredSetting]) -> list[DeclaredSetting]:
    """The settings the chart's `config:` block holds."""
    return [setting for setting in declared if setting.helm_key is not None]


def _key(setting: DeclaredSetting) -> str:
    assert setting.helm_key is not None
    return setting.helm_key


def _numeric(setting: DeclaredSetting) -> str | None:
    if setting.kind is int:
        return "integer"
    if setting.kind is float:
        return "number"
    return None


def schema_properties(declared: Sequence[DeclaredSetting]) -> dict[str, Any]:
    """values.schema.json's `config.properties`."""
    return {_key(setting): _property(setting) for setting in chart_settings(declared)}


def _property(setting: DeclaredSetting) -> dict[str, Any]:
    key = _key(setting)
    nullable = key not in _NOT_NULL
    numeric = _numeric(setting)
    prop: dict[str, Any] = {"description": f"{setting.env}: {_plain(setting.info.help)}"}
    if numeric is not None:
        prop["type"] = [numeric, "null"] if nullable else numeric
        for bound, attribute, keyword in (
            (annotated_types.Ge, "ge", "minimum"),
            (annotated_types.Gt, "gt", "exclusiveMinimum"),
            (annotated_types.Le, "le", "maximum"),
            (annotated_types.Lt, "lt", "exclusiveMaximum"),
        ):
            found = setting.bound(bound)
            if found is not None:
                prop[keyword] = getattr(found, attribute)
    elif setting.kind is bool:
        prop["type"] = ["string", "boolean"]
        prop["enum"] = ["", "on", "off", True, False]
    else:
        prop["type"] = "string"
        if setting.choices is not None:
            prop["enum"] = ["", *setting.choices]
        pattern = next((item.pattern for item in setting.field.metadata if hasattr(item, "pattern")), None)
        if pattern:
            prop["pattern"] = "^(" + pattern.removeprefix("^").removesuffix("$") + ")?$"
        if key in CHART_REQUIRED:
            prop["minLength"] = 1
    prop.update(_SCHEMA_OVERRIDES.get(key, {}))
    return prop


def with_schema(schema: dict[str, Any], declared: Sequence[DeclaredSetting]) -> dict[str, Any]:
    """`schema` (values.schema.json) with its `config` properties and required keys made anew."""
    config = schema["properties"]["config"]
    config["required"] = list(CHART_REQUIRED)
    config["properties"] = schema_properties(declared)
    return schema


def config_block(declared: Sequence[DeclaredSetting]) -> str:
    """values.yaml's `config:` block, each key under a comment: its variable (or flag), help,
    what unset means and the chart's note."""
    lines = ["config:"]
    for setting in chart_settings(declared):
        key = _key(setting)
        source = setting.flag if key in CHART_FLAGS else setting.env
        unset = "null" if _numeric(setting) else "empty"
        words = f"{source}: {_plain(setting.info.help)}."
        if key in CHART_VALUES:
            words += f" Weir's default: {_plain(setting.default_display())}."
        else:
            spellings = " on or off (or true or false);" if setting.kind is bool else ""
            words += f"{spellings} {unset}: {_plain(setting.default_display())}."
        if key in CHART_NOTES:
            words += " " + CHART_NOTES[key]
        lines += textwrap.wrap(
            words, width=100, initial_indent="  # ", subsequent_indent="  # ", break_on_hyphens=False
        )
        lines.append(f"  {key}: {_yaml_value(CHART_VALUES.get(key), unset)}")
    return "\n".join(lines)


def with_config_block(values_yaml: str, block: str) -> str:
    """values.yaml with its `config:` block (up to the first blank line) replaced by `block`."""
    start = values_yaml.index("\nconfig:\n") + 1
    end = values_yaml.index("\n\n", start)
    return values_yaml[:start] + block + values_yaml[end:]


def env_pairs(declared: Sequence[DeclaredSetting]) -> str:
    """_helpers.tpl's `weir.configEnv` list: each variable and the value it gets."""
    pairs = []
    for setting in chart_settings(declared):
        key = _key(setting)
        if key not in CHART_FLAGS:
            value = _ENV_EXPRESSIONS.get(key, f".Values.config.{key}")
            pairs.append(_PAIR.format(env=setting.env, value=value))
    return "\n".join(pairs)


def with_env_pairs(helpers: str, pairs: str) -> str:
    """_helpers.tpl with its run of `$pairs = append` lines replaced by `pairs`."""
    found = list(_PAIR_LINE.finditer(helpers))
    if not found:
        raise ValueError('_helpers.tpl has no `$pairs = append $pairs (list "WEIR_..." ...)` lines')
    return helpers[: found[0].start()] + pairs + helpers[found[-1].end() :]


def _yaml_value(value: Any, unset: str) -> str:
    if value is None:
        return "null" if unset == "null" else '""'
    if isinstance(value, str):
        return f'"{value}"' if value[:1].isdigit() else value
    return str(value)


def _plain(text: str) -> str:
    return text.replace("`", "")
