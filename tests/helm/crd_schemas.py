"""Strict JSON schemas for the custom resources the chart renders, which kubernetes-validate does
not ship: ServiceMonitor (monitoring.coreos.com/v1), InferencePool
(inference.networking.k8s.io/v1) and HTTPRoute (gateway.networking.k8s.io/v1).

These are NOT the published CRDs: the CRD files of prometheus-operator, the Gateway API and its
Inference Extension are not vendored into this repository (no third-party repository content is
copied here). Each schema below is written from the published API reference of that version and
covers the fields the chart can render, with their published constraints (required fields,
enums, ranges, patterns). Any other field is refused (strict), so a typo or a field of another
API version fails. `metadata` is checked against Kubernetes' own ObjectMeta schema by
`custom_resource_errors`. The cluster's API server applies the full CRD at install time.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from jsonschema import Draft202012Validator

# Shapes shared by the schemas below.
_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_LABEL_VALUE = {
    "type": "string",
    "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
_MATCH_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
# prometheus-operator's Duration: "30s", "1m30s", "500ms".
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _object(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {"type": "object"},
            "spec": spec,
        },
        required=("apiVersion", "kind", "metadata", "spec"),
    )


SERVICE_MONITOR = _resource(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    _object(
        {
            "selector": _object({"matchLabels": _MATCH_LABELS}),
            "namespaceSelector": _object(
                {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _NAME}}
            ),
            "endpoints": {
                "type": "array",
                "items": _object(
                    {
                        "port": {"type": "string", "minLength": 1},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                    }
                ),
            },
        },
        required=("selector",),
    ),
)

INFERENCE_POOL = _resource(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    _object(
        {
            "targetPorts": {
                "type": "array",
                "minItems": 1,
                "maxItems": 8,
                "items": _object({"number": _PORT}, ("number",)),
            },
            "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
            "selector": _object(
                {
                    "matchLabels": {
                        "type": "object",
                        "minProperties": 1,
                        "maxProperties": 64,
                        "additionalProperties": _LABEL_VALUE,
                    }
                },
                required=("matchLabels",),
            ),
            "endpointPickerRef": {
                **_object(
                    {
                        "group": {"type": "string", "maxLength": 253},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                        "name": _NAME,
                        "port": _object({"number": _PORT}, ("number",)),
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    required=("name",),
                ),
                # A Service (the default kind) needs its port.
                "if": {"not": {"required": ["kind"]}, "then": {"required": ["port"]}},
                "else": {
                    "if": {"properties": {"kind": {"const": "Service"}}},
                    "then": {"required": ["port"]},
                },
            },
        },
        required=("selector", "targetPorts"),
    ),
)

_PARENT_REF = _object(
    {
        "group": {"type": "string"},
        "kind": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63},
        "name": _NAME,
        "sectionName": {"type": "string"},
        "port": _PORT,
    },
    required=("name",),
)

HTTP_ROUTE = _resource(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    _object(
        {
            "parentRefs": {"type": "array", "maxItems": 32, "items": _PARENT_REF},
            "hostnames": {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}},
            "rules": {
                "type": "array",
                "maxItems": 16,
                "items": _object(
                    {
                        "matches": {
                            "type": "array",
                            "items": _object(
                                {
                                    "path": _object(
                                        {
                                            "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                                            "value": {"type": "string", "pattern": "^/"},
                                        }
                                    )
                                }
                            ),
                        },
                        "backendRefs": {
                            "type": "array",
                            "items": _object(
                                {
                                    "group": {"type": "string"},
                                    "kind": {"type": "string"},
                                    "name": _NAME,
                                    "namespace": {"type": "string"},
                                    "port": _PORT,
                                    "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
                                },
                                required=("name",),
                            ),
                        },
                    }
                ),
            },
        }
    ),
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
}


def is_custom_resource(doc: dict[str, Any]) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) in SCHEMAS


def custom_resource_errors(doc: dict[str, Any], kube_version: str) -> list[str]:
    """Why a custom resource is invalid (its schema above; metadata as Kubernetes' ObjectMeta)."""
    schema = SCHEMAS[(doc["apiVersion"], doc["kind"])]
    errors = [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in Draft202012Validator(schema).iter_errors(doc)
    ]
    # ObjectMeta is the same for every kind: check it as a ConfigMap's.
    try:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}, kube_version, strict=True
        )
    except kubernetes_validate.ValidationError as exc:
        errors.append(f"metadata/{'/'.join(str(p) for p in exc.absolute_path)}: {exc.message}")
    return errors
