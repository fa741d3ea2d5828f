"""helm/weir/values.schema.json, checked with the jsonschema package: it is a valid draft-07
schema, values.yaml satisfies it, it refuses bad values where they are, and its enums are the
ones Settings accepts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from jsonschema import Draft7Validator

from tests.helm.chart_files import CHART, chart_values, read
from weir.engine.config import QueuePolicy
from weir.gateway.settings.settings import (
    DTYPES,
    AttentionBackend,
    AuthMode,
    CudaGraphsMode,
    LogLevel,
    OtelExporter,
)


def _schema() -> dict[str, Any]:
    schema = json.loads(read(CHART / "values.schema.json"))
    assert isinstance(schema, dict)
    return schema


def _schema_errors(schema: dict[str, Any], value: Any) -> dict[str, str]:
    """Validation errors of `value`: dotted path (`<root>` for the top) -> message.

    jsonschema's draft-07 `integer` accepts an integral float, as Helm (which reads every number
    as a float) needs.
    """
    return {
        ".".join(str(part) for part in error.absolute_path) or "<root>": error.message
        for error in Draft7Validator(schema).iter_errors(value)
    }


def test_schema_is_a_valid_draft_07_schema() -> None:
    schema = _schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    Draft7Validator.check_schema(schema)  # raises SchemaError naming the bad keyword


def test_values_yaml_satisfies_the_schema() -> None:
    assert _schema_errors(_schema(), chart_values()) == {}
    values = copy.deepcopy(chart_values())
    values["replicaCount"] = 2.0  # how Helm reads `--set replicaCount=2`
    assert _schema_errors(_schema(), values) == {}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("config.dtype", "bf16"),
        ("config.queuePolicy", "lifo"),
        ("config.maxNumSeqs", 0),
        ("config.leaseTtlS", 0),
        ("config.port", 70000),
        ("config.kvCacheToken", 4096),  # a typo of kvCacheTokens
        ("database.type", "mysql"),
        ("persistence.cache.accessModes", ["ReadWriteSometimes"]),
        ("shutdown.preStopSleepSeconds", -1),
        ("replicaCount", 1.5),
    ],
)
def test_schema_rejects_bad_values(path: str, value: Any) -> None:
    values = copy.deepcopy(chart_values())
    *parents, last = path.split(".")
    node = values
    for part in parents:
        node = node[part]
    node[last] = value
    errors = _schema_errors(_schema(), values)
    # Refused for this value, at its path (a list item: below it; a misspelt key: at its parent).
    assert errors and all(path.startswith(where) or where.startswith(path) for where in errors), errors


def test_schema_enums_are_the_ones_settings_accepts() -> None:
    config = _schema()["properties"]["config"]["properties"]
    expected = {
        "dtype": DTYPES,
        "auth": [m.value for m in AuthMode],
        "queuePolicy": [m.value for m in QueuePolicy],
        "attentionBackend": [m.value for m in AttentionBackend],
        "cudaGraphs": [m.value for m in CudaGraphsMode],
        "otelExporter": [m.value for m in OtelExporter],
        "logLevel": [m.value for m in LogLevel],
    }
    for key, allowed in expected.items():
        assert config[key]["enum"] == ["", *allowed], key
    for key in ("admission", "prefixCaching", "gcFreeze", "cpuKernelPool", "cpuDecodeLayers"):
        assert config[key]["enum"] == ["", "on", "off", True, False], key  # booleans, or their old spelling
    # Every config value has a schema, and nothing else does.
    assert set(config) == set(chart_values()["config"])


@pytest.mark.parametrize(
    ("path", "value"),
    [("config.metricsPort", -1), ("config.metricsPort", 70000), ("ingress.publishAdmin", "yes")],
)
def test_schema_rejects_bad_exposure_values(path: str, value: Any) -> None:
    values = copy.deepcopy(chart_values())
    section, key = path.split(".")
    values[section][key] = value
    assert list(_schema_errors(_schema(), values)) == [path]
