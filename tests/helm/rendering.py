"""The chart rendered and linted by Helm's own engine (helm-python-sdk: Helm's Go SDK through a C
ABI, no `helm` binary, no cluster), and every rendered object checked against the Kubernetes
OpenAPI schemas (kubernetes-validate, strict) at the Kubernetes versions the chart declares.

Profiles are the values files in helm/weir/ci/ (`<name>-values.yaml`), plus `default` (values.yaml
alone). Objects of custom resources (ServiceMonitor, InferencePool, HTTPRoute) are checked by
`tests.helm.crd_schemas` instead, since kubernetes-validate ships only the built-in kinds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import helm_python
import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions

from tests.helm.chart_files import CHART, read

RELEASE = "weir"
NAMESPACE = "ai"
PROFILES_DIR = CHART / "ci"
PROFILE_SUFFIX = "-values.yaml"


def profile_names() -> list[str]:
    """`default` and every profile in helm/weir/ci/, by name."""
    names = sorted(p.name.removesuffix(PROFILE_SUFFIX) for p in PROFILES_DIR.glob(f"*{PROFILE_SUFFIX}"))
    return ["default", *names]


def profile_values(name: str) -> dict[str, Any]:
    """The values a profile sets over values.yaml ({} for `default`)."""
    if name == "default":
        return {}
    values = yaml.safe_load(read(PROFILES_DIR / f"{name}{PROFILE_SUFFIX}"))
    assert isinstance(values, dict), name
    return values


@dataclass(frozen=True)
class Manifest:
    """One rendered object and the template that made it."""

    template: str  # e.g. "deployment.yaml"
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    @property
    def api_version(self) -> str:
        return str(self.doc["apiVersion"])


def render(values: dict[str, Any] | None = None, *, release: str = RELEASE) -> list[Manifest]:
    """Every object the chart renders for `values` (an install; NOTES.txt left out).

    Raises helm_python.HelmValuesError when the values fail values.schema.json, and
    helm_python.HelmRenderError when a template fails (a `fail` of weir.validate included).
    """
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=release, namespace=NAMESPACE, is_install=True)
    manifests = []
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                assert isinstance(doc, dict), (path, doc)
                manifests.append(Manifest(path.rsplit("/", 1)[-1], doc))
    return manifests


@cache
def render_profile(name: str) -> tuple[Manifest, ...]:
    """The objects of a profile (rendered once per test session)."""
    return tuple(render(profile_values(name)))


def only(manifests: tuple[Manifest, ...] | list[Manifest], kind: str, name: str | None = None) -> Manifest:
    """The one object of `kind` (and `name`, when given)."""
    found = [m for m in manifests if m.kind == kind and (name is None or m.name == name)]
    assert len(found) == 1, (kind, name, [(m.kind, m.name) for m in manifests])
    return found[0]


def kinds(manifests: tuple[Manifest, ...] | list[Manifest]) -> list[str]:
    return sorted(m.kind for m in manifests)


def lint(values: dict[str, Any] | None, kube_version: str) -> list[dict[str, Any]]:
    """`helm lint --strict` findings worse than info: warnings (2) and errors (3)."""
    report = helm_python.lint(
        CHART, values or {}, strict=True, namespace=NAMESPACE, kube_version=kube_version
    )
    messages = [m for m in report["messages"] if m["severity"] >= 2]
    return messages + [{"severity": 3, "path": "", "error": e} for e in report["errors"]]


def declared_kube_floor() -> str:
    """The lowest Kubernetes version Chart.yaml's kubeVersion accepts, e.g. "1.25.0"."""
    declared = str(yaml.safe_load(read(CHART / "Chart.yaml"))["kubeVersion"])
    match = re.fullmatch(r">=\s*v?(\d+\.\d+\.\d+)(?:-0)?", declared.strip())
    assert match, f"kubeVersion {declared!r} is not a plain lower bound"
    return match.group(1)


def kube_versions() -> list[str]:
    """The versions every manifest is checked at: the declared floor and the newest schemas
    kubernetes-validate ships (an API removed since the floor fails there)."""
    floor = declared_kube_floor()
    shipped = all_versions()
    assert floor in shipped, f"kubernetes-validate {kubernetes_validate.__version__} has no {floor} schemas"
    return [floor, shipped[-1]]


def kubernetes_errors(manifest: Manifest, version: str) -> str | None:
    """Why a built-in object is invalid at `version` (strict: unknown fields too), or None."""
    try:
        kubernetes_validate.validate(manifest.doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"{manifest.template}: {manifest.kind}/{manifest.name} at {where or '<root>'}: {exc.message}"
    return None


def containers(pod_owner: Manifest) -> Iterator[dict[str, Any]]:
    """Init containers, then containers, of a Deployment's or Job's pod template."""
    spec = pod_owner.doc["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def picker_config(manifests: tuple[Manifest, ...] | list[Manifest]) -> dict[str, Any]:
    """The endpoint picker's EndpointPickerConfig, parsed from its rendered ConfigMap."""
    (config_map,) = [m for m in manifests if m.kind == "ConfigMap" and m.name.endswith("-epp")]
    config = yaml.safe_load(config_map.doc["data"]["weir-plugins.yaml"])
    assert isinstance(config, dict)
    return config


def picker_metric_names(config: dict[str, Any]) -> dict[str, str]:
    """The "weir" engine config of the picker's core-metrics-extractor: spec field -> metric name."""
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    (engine,) = [e for e in extractor["parameters"]["engineConfigs"] if e["name"] == "weir"]
    return {k: v for k, v in engine.items() if k.endswith("Spec")}
