"""The chart rendered and linted with Helm's own engine for the default values and every profile in
helm/weir/ci/, and every rendered object validated against the Kubernetes schemas (strict) at the
declared floor version and the newest one kubernetes-validate ships. Bad values fail rendering.

What the rendered objects say (secrets, routes, probes, the Inference Gateway wiring):
test_rendered_objects.py.
"""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import pytest

from tests.helm.crd_schemas import custom_resource_errors, is_custom_resource
from tests.helm.rendering import (
    Manifest,
    kube_versions,
    kubernetes_errors,
    lint,
    only,
    profile_names,
    profile_values,
    render,
    render_profile,
)

PROFILES = profile_names()


def test_every_documented_profile_is_here() -> None:
    # docs/kubernetes.md and helm/weir/README.md describe these shapes; each has a values file.
    assert set(PROFILES) >= {
        "default",
        "sqlite",
        "postgres-replicas",
        "gpu-nodes",
        "ingress",
        "servicemonitor",
        "inference-gateway",
    }


def test_kubernetes_versions_are_the_declared_floor_and_the_newest() -> None:
    floor, newest = kube_versions()
    assert floor == "1.25.0"
    assert tuple(int(x) for x in newest.split(".")) > (1, 25, 0)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("version", kube_versions())
def test_lint_finds_no_error_or_warning(profile: str, version: str) -> None:
    assert lint(profile_values(profile), "v" + version) == []


@pytest.mark.parametrize("profile", PROFILES)
def test_every_rendered_object_is_valid(profile: str) -> None:
    manifests = render_profile(profile)
    assert manifests
    errors: list[str] = []
    for version in kube_versions():
        for manifest in manifests:
            if is_custom_resource(manifest.doc):
                errors += [
                    f"{manifest.kind}/{manifest.name}: {e}"
                    for e in custom_resource_errors(manifest.doc, version)
                ]
            elif (error := kubernetes_errors(manifest, version)) is not None:
                errors.append(f"{version} {error}")
    assert errors == []


def test_validation_is_strict_and_catches_errors() -> None:
    """The validators used above refuse a misspelt field and a wrong type, so 'valid' means something."""
    (floor, _) = kube_versions()
    deployment = next(m for m in render_profile("default") if m.kind == "Deployment")
    bad = copy.deepcopy(deployment.doc)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert kubernetes_errors(Manifest("deployment.yaml", bad), floor)
    bad = copy.deepcopy(deployment.doc)
    bad["spec"]["replicas"] = "two"
    assert kubernetes_errors(Manifest("deployment.yaml", bad), floor)
    pool = next(m for m in render_profile("inference-gateway") if m.kind == "InferencePool")
    bad = copy.deepcopy(pool.doc)
    bad["spec"]["endpointPickerRef"]["failureMode"] = "FailSometimes"
    assert custom_resource_errors(bad, floor)
    bad = copy.deepcopy(pool.doc)
    del bad["spec"]["endpointPickerRef"]["port"]  # a Service reference needs its port
    assert custom_resource_errors(bad, floor)
    bad = copy.deepcopy(pool.doc)
    bad["metadata"]["labelz"] = {}
    assert custom_resource_errors(bad, floor)


def test_profiles_render_the_objects_they_are_for() -> None:
    def kinds(profile: str) -> set[str]:
        return {m.kind for m in render_profile(profile)}

    base = {"ConfigMap", "Deployment", "Service", "ServiceAccount"}
    assert kinds("default") == base | {"PersistentVolumeClaim"}
    assert "Secret" not in set().union(*(kinds(p) for p in PROFILES))
    assert kinds("postgres-replicas") >= base | {"Job", "PodDisruptionBudget"}
    assert "Ingress" in kinds("ingress")
    assert "ServiceMonitor" in kinds("servicemonitor")
    assert kinds("inference-gateway") >= base | {
        "InferencePool",
        "HTTPRoute",
        "HorizontalPodAutoscaler",
        "Role",
        "RoleBinding",
        "Job",
    }
    # Off by default: no Inference Gateway object, no autoscaler.
    assert not kinds("default") & {"InferencePool", "HTTPRoute", "HorizontalPodAutoscaler", "Role"}


# -- bad values fail rendering ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"config": {"dtype": "fp8"}}, "/config/dtype"),
        (
            {"inferenceGateway": {"pool": {"failureMode": "FailSometimes"}}},
            "/inferenceGateway/pool/failureMode",
        ),
        ({"autoscaling": {"metric": "cpu"}}, "/autoscaling/metric"),
        ({"secrets": {"adminToken": "plain-text"}}, "adminToken"),  # secrets only by reference
        ({"replicaCoutn": 2}, "replicaCoutn"),  # a misspelt top-level key
    ],
)
def test_a_value_against_the_schema_fails_rendering(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as raised:
        render(values)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 2}, "replicaCount > 1 needs database.type postgresql"),
        ({"database": {"type": "postgresql"}}, "needs secrets.existingSecret"),
        (
            {"database": {"type": "postgresql"}, "secrets": {"existingSecret": "s"}, "replicaCount": 2},
            "persistence.cache need",
        ),
        ({"autoscaling": {"enabled": True}}, "autoscaling needs database.type postgresql"),
        (
            {"metrics": {"serviceMonitor": {"enabled": True}}, "config": {"metricsPort": 0}},
            "needs config.metricsPort",
        ),
        ({"config": {"metricsPort": 8000}}, "config.metricsPort must differ from config.port"),
        (
            {"inferenceGateway": {"enabled": True}, "config": {"metricsPort": 0}},
            "inferenceGateway needs config.metricsPort",
        ),
        (
            {
                "ingress": {
                    "enabled": True,
                    "hosts": [{"host": "h", "paths": [{"path": "/", "pathType": "Prefix"}]}],
                }
            },
            "would publish",
        ),
        (
            {
                "ingress": {
                    "enabled": True,
                    "hosts": [{"host": "h", "paths": [{"path": "/metrics", "pathType": "Prefix"}]}],
                }
            },
            "would publish",
        ),
        ({"config": {"kvStoreUrl": "redis://valkey:6379/0"}}, "kvStore needs kvStore.existingSecret"),
        ({"kvStore": {"valkey": {"enabled": True}}}, "kvStore needs kvStore.existingSecret"),
    ],
)
def test_values_that_cannot_work_fail_rendering_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as raised:
        render(values)
    assert message in str(raised.value)


def test_the_kubelet_sleep_action_exists_only_from_kubernetes_1_30() -> None:
    """Why weir.validate refuses shutdown.nativeSleep on a cluster below 1.30: the preStop `sleep`
    action is not in the older schemas. (That `fail` is not testable here: Helm renders with its
    own Kubernetes version, which is newer, and lint mode only logs a template's `fail`.)"""
    (floor, newest) = kube_versions()
    deployment = only(render({"shutdown": {"nativeSleep": True}}), "Deployment")
    (server,) = deployment.doc["spec"]["template"]["spec"]["containers"]
    assert server["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}
    assert kubernetes_errors(deployment, newest) is None
    assert "sleep" in str(kubernetes_errors(deployment, floor))


def test_lint_reports_a_broken_value_as_an_error() -> None:
    findings = lint({"database": {"type": "mysql"}}, "v" + kube_versions()[0])
    assert findings and all(f["severity"] == 3 for f in findings)
    assert any("/database/type" in f["error"] for f in findings)
