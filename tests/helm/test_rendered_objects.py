"""What the rendered chart hands to Weir and to the cluster, for every profile: the settings
ConfigMap is what Settings accepts, every `weir` command line parses, secrets come only by
reference, /metrics and /admin/v1 are never routed by default, probes hit real routes, the model
is prepared before the server starts, and the Inference Gateway objects point at each other.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helm.chart_files import ROOT, read
from tests.helm.rendering import (
    Manifest,
    containers,
    only,
    picker_config,
    picker_metric_names,
    profile_names,
    profile_values,
    render,
    render_profile,
)
from weir.cli import build_parser
from weir.gateway.settings.settings import Settings

PROFILES = profile_names()
POD_OWNERS = ("Deployment", "Job")


def _pod_owners(profile: str) -> list[Manifest]:
    return [m for m in render_profile(profile) if m.kind in POD_OWNERS]


def _server(profile: str) -> Manifest:
    return only(render_profile(profile), "Deployment", "weir")


def _weir_settings(profile: str) -> Settings:
    """Settings as the server container would build them from the rendered ConfigMap and args."""
    config = only(render_profile(profile), "ConfigMap", "weir-config").doc["data"]
    assert all(isinstance(v, str) for v in config.values()), config
    (server,) = _server(profile).doc["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args([*server["command"][1:], *server["args"]])
    # Required secrets come by reference (secretKeyRef): a stand-in value each, as the pod would have.
    secrets = {
        e["name"]: "stand-in-secret-value-0123456789"
        for e in server.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {}) and not e["valueFrom"]["secretKeyRef"].get("optional")
    }
    return Settings.from_sources({"host": args.host, "port": args.port}, {**config, **secrets})


@pytest.mark.parametrize("profile", PROFILES)
def test_settings_come_from_the_config_map_and_are_accepted(profile: str) -> None:
    settings = _weir_settings(profile)
    values = profile_values(profile)
    assert settings.metrics_port == 9464
    assert str(settings.cache_dir) == "/var/cache/weir"
    if profile == "default":
        assert settings.auth_mode.value == "keys"  # a public bind requires API keys
    for key, value in values.get("config", {}).items():
        # Every config value of the profile reached its WEIR_* variable.
        env = "WEIR_" + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper()
        data = only(render_profile(profile), "ConfigMap", "weir-config").doc["data"]
        rendered = data[env]
        assert rendered == (
            str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        )
    # Every pod container that runs weir reads the ConfigMap (the migration hook needs none).
    server_pod = _server(profile).doc["spec"]["template"]["spec"]
    for container in [*server_pod.get("initContainers", []), *server_pod["containers"]]:
        if container["name"] == "migrate":
            continue
        assert {"configMapRef": {"name": "weir-config"}} in container["envFrom"], container["name"]


def test_gpu_profile_defaults_the_device_to_cuda_and_requests_a_gpu() -> None:
    assert _weir_settings("gpu-nodes").device == "cuda"
    (server,) = _server("gpu-nodes").doc["spec"]["template"]["spec"]["containers"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Without gpu.enabled the chart leaves the device to Weir's detection.
    assert "WEIR_DEVICE" not in only(render_profile("default"), "ConfigMap", "weir-config").doc["data"]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_weir_command_line_is_accepted(profile: str) -> None:
    seen = []
    for owner in _pod_owners(profile):
        for container in containers(owner):
            if container.get("command") != ["weir"]:
                continue
            try:
                args = build_parser().parse_args(container["args"])
            except SystemExit:
                pytest.fail(f"weir rejects {container['args']} ({owner.name}/{container['name']})")
            assert callable(args.func)
            seen.append(container["args"][0])
            if container["args"][0] == "serve":
                assert (args.host, args.port) == ("0.0.0.0", 8000)  # every interface, the container port
    assert "serve" in seen


def test_the_model_is_prepared_before_the_server_starts() -> None:
    pod = _server("default").doc["spec"]["template"]["spec"]
    prepare = next(c for c in pod["initContainers"] if c["name"] == "model-prepare")
    assert prepare["args"][:2] == ["model", "prepare"]
    mounts = {m["name"]: m["mountPath"] for m in prepare["volumeMounts"]}
    assert mounts["cache"] == str(_weir_settings("default").cache_dir)  # into the cache volume
    # So the startup probe only covers loading: well under the 15 minutes it allowed before.
    (server,) = pod["containers"]
    probe = server["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 300
    # A model folder of your own: nothing to prepare.
    own = only(render({"config": {"model": "/models/llama"}}), "Deployment")
    assert "model-prepare" not in {
        c["name"] for c in own.doc["spec"]["template"]["spec"].get("initContainers", [])
    }


# -- secrets only by reference ----------------------------------------------------------------------


def _env_entries(owner: Manifest) -> list[dict[str, Any]]:
    return [entry for container in containers(owner) for entry in container.get("env", [])]


@pytest.mark.parametrize("profile", PROFILES)
def test_secrets_come_only_by_reference(profile: str) -> None:
    manifests = render_profile(profile)
    assert "Secret" not in {m.kind for m in manifests}
    secret_vars = {"WEIR_ADMIN_TOKEN", "WEIR_KEY_PEPPER", "WEIR_DATABASE_URL"}
    config = only(manifests, "ConfigMap", "weir-config").doc["data"]
    assert not secret_vars & set(config)
    existing = profile_values(profile).get("secrets", {}).get("existingSecret")
    for owner in _pod_owners(profile):
        for entry in _env_entries(owner):
            if entry["name"] in secret_vars:
                assert "value" not in entry, (owner.name, entry)
                assert entry["valueFrom"]["secretKeyRef"]["name"] == existing
    if profile_values(profile).get("database", {}).get("type") == "postgresql":
        job = only(manifests, "Job")
        (url,) = [e for e in _env_entries(job) if e["name"] == "WEIR_DATABASE_URL"]
        assert url["valueFrom"]["secretKeyRef"] == {"name": existing, "key": "WEIR_DATABASE_URL"}
        assert job.doc["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"


# -- /metrics and /admin/v1 stay with the operator --------------------------------------------------


def _app_routes() -> set[str]:
    return set(re.findall(r"Route\(\"(/[^\"]*)\"", read(ROOT / "gateway" / "server" / "app.py")))


def _routed_paths(manifests: tuple[Manifest, ...] | list[Manifest]) -> list[str]:
    paths = []
    for m in manifests:
        if m.kind == "Ingress":
            paths += [p["path"] for rule in m.doc["spec"]["rules"] for p in rule["http"]["paths"]]
        if m.kind == "HTTPRoute":
            paths += [x["path"]["value"] for rule in m.doc["spec"]["rules"] for x in rule["matches"]]
    return paths


def _covers(prefix: str, path: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/") or prefix == "/"


@pytest.mark.parametrize("profile", PROFILES)
def test_metrics_and_admin_are_never_routed_by_default(profile: str) -> None:
    manifests = render_profile(profile)
    for prefix in _routed_paths(manifests):
        assert prefix == "/v1", prefix
        for private in ("/metrics", "/admin/v1/tenants", "/admin/v1", "/admin/ui", "/admin/ui/login"):
            assert not _covers(prefix, private), (prefix, private)
    # Every Ingress backend is the API port, never the metrics port.
    for m in manifests:
        if m.kind == "Ingress":
            for rule in m.doc["spec"]["rules"]:
                assert {p["backend"]["service"]["port"]["name"] for p in rule["http"]["paths"]} == {"http"}


def test_admin_is_routed_only_when_asked() -> None:
    values = {
        **profile_values("ingress"),
        "ingress": {**profile_values("ingress")["ingress"], "publishAdmin": True},
    }
    routed = sorted(set(_routed_paths(render(values))))
    assert routed == ["/admin/v1", "/v1"]
    # Publishing the admin API does not publish the browser console (issue 26): reach /admin/ui
    # with `kubectl port-forward`, where its session cookie stays on a private origin.
    assert not any(_covers(prefix, "/admin/ui/login") for prefix in routed)


@pytest.mark.parametrize("profile", PROFILES)
def test_probes_and_scrapes_hit_real_routes(profile: str) -> None:
    routes = _app_routes()
    (server,) = _server(profile).doc["spec"]["template"]["spec"]["containers"]
    probes = {k: server[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": "/ready", "livenessProbe": "/health", "readinessProbe": "/ready"}
    assert set(probes.values()) <= routes
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": 8000, "metrics": 9464}
    for m in render_profile(profile):
        if m.kind == "ServiceMonitor":
            assert [(e["port"], e["path"]) for e in m.doc["spec"]["endpoints"]] == [("metrics", "/metrics")]


# -- rollouts and autoscaling -----------------------------------------------------------------------


def test_replicas_roll_without_dropping_requests() -> None:
    pod = _server("postgres-replicas").doc["spec"]["template"]["spec"]
    strategy = _server("postgres-replicas").doc["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (server,) = pod["containers"]
    sleep_s = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = _weir_settings("postgres-replicas").shutdown_grace_s
    assert pod["terminationGracePeriodSeconds"] >= sleep_s + grace + 5
    assert _server("default").doc["spec"]["strategy"] == {"type": "Recreate"}  # SQLite: never two


def test_the_autoscaler_scales_the_server_on_a_metric_weir_exports() -> None:
    manifests = render_profile("inference-gateway")
    hpa = only(manifests, "HorizontalPodAutoscaler").doc["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "weir"}
    (metric,) = hpa["metrics"]
    assert metric["pods"]["metric"]["name"] in {"weir_server_waiting_tokens", "weir_server_requests_waiting"}
    assert "replicas" not in _server("inference-gateway").doc["spec"]  # the HPA owns the count
    assert only(manifests, "PodDisruptionBudget").doc["spec"]["maxUnavailable"] == 1


# -- the Inference Gateway --------------------------------------------------------------------------


def test_the_pool_selects_the_server_pods_and_names_the_picker() -> None:
    manifests = render_profile("inference-gateway")
    pool = only(manifests, "InferencePool").doc["spec"]
    server = _server("inference-gateway").doc["spec"]
    pod_labels = server["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["selector"]["matchLabels"] == server["selector"]["matchLabels"]
    assert pool["targetPorts"] == [{"number": 8000}]  # the API port
    picker_service = only(manifests, "Service", pool["endpointPickerRef"]["name"]).doc["spec"]
    assert pool["endpointPickerRef"]["port"]["number"] in {p["port"] for p in picker_service["ports"]}
    picker = only(manifests, "Deployment", "weir-epp").doc["spec"]
    assert picker_service["selector"].items() <= picker["template"]["metadata"]["labels"].items()
    args = picker["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == only(manifests, "InferencePool").name
    assert args[args.index("--pool-group") + 1] == "inference.networking.k8s.io"
    # The picker's engine config applies to Weir's pods through their engine-type label.
    assert pod_labels["llm-d.ai/engine-type"] == "weir"
    route = only(manifests, "HTTPRoute").doc["spec"]
    (backend,) = route["rules"][0]["backendRefs"]
    assert (backend["kind"], backend["name"]) == ("InferencePool", only(manifests, "InferencePool").name)


def test_the_picker_scrapes_the_metrics_port_for_weirs_metric_names() -> None:
    config = picker_config(render_profile("inference-gateway"))
    assert config["kind"] == "EndpointPickerConfig"
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    assert source["parameters"]["port"] == 9464 and source["parameters"]["path"] == "/metrics"
    assert picker_metric_names(config) == {
        "queuedRequestsSpec": "weir_server_requests_waiting",
        "runningRequestsSpec": "weir_server_requests_running",
        "kvUsageSpec": "weir_server_kv_cache_usage_ratio",
        "cacheBlockSizeSpec": "weir_server_kv_cache_block_size",
        "cacheNumBlocksSpec": "weir_server_kv_cache_total_blocks",
    }
    # Every plugin a scheduling profile refers to is declared.
    declared = {p.get("name", p["type"]) for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {ref["pluginRef"] for ref in profile["plugins"]} <= declared
    # The names are documented for operators.
    docs = read(ROOT / "docs" / "kubernetes.md") + read(ROOT / "docs" / "operations.md")
    assert all(f"`{name}`" in docs for name in picker_metric_names(config).values())


def test_the_kv_store_profile_runs_its_own_valkey_and_reads_the_mac_key_from_the_secret() -> None:
    settings = _weir_settings("kv-store")
    assert settings.kv_store_url == "redis://weir-kv-store:6379/0"
    (server,) = _server("kv-store").doc["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in server["env"] if "valueFrom" in e}
    assert refs["WEIR_KV_STORE_SECRET"] == {"name": "weir-kv-store", "key": "WEIR_KV_STORE_SECRET"}
    assert refs["WEIR_KV_STORE_PASSWORD"]["optional"] is True
    store = only(render_profile("kv-store"), "Deployment", "weir-kv-store").doc
    service = only(render_profile("kv-store"), "Service", "weir").doc
    store_labels = store["spec"]["template"]["metadata"]["labels"]
    # The server's Service and Deployment never select the store's pod.
    assert not set(service["spec"]["selector"].items()) <= set(store_labels.items())
    assert (
        only(render_profile("kv-store"), "Service", "weir-kv-store").doc["spec"]["ports"][0]["port"] == 6379
    )
    assert "WEIR_KV_STORE_URL" not in only(render_profile("default"), "ConfigMap", "weir-config").doc["data"]
    # The chart's Valkey requires the password Weir's pods read, from the same Secret key.
    (valkey,) = store["spec"]["template"]["spec"]["containers"]
    assert valkey["env"] == [
        {
            "name": "WEIR_KV_STORE_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "weir-kv-store", "key": "WEIR_KV_STORE_PASSWORD"}},
        }
    ]
    assert valkey["args"][-2:] == ["--requirepass", "$(WEIR_KV_STORE_PASSWORD)"]


def test_the_charts_valkey_can_run_without_a_password() -> None:
    values = {
        "kvStore": {"existingSecret": "weir-kv-store", "valkey": {"enabled": True, "requirePassword": False}}
    }
    (valkey,) = only(render(values), "Deployment", "weir-kv-store").doc["spec"]["template"]["spec"][
        "containers"
    ]
    assert "env" not in valkey and "--requirepass" not in valkey["args"]


def test_on_off_settings_take_yaml_booleans_and_their_old_spelling() -> None:
    values = {"config": {"prefixCaching": False, "admission": True, "gcFreeze": "off"}}
    config = only(render(values), "ConfigMap", "weir-config").doc["data"]
    assert (config["WEIR_PREFIX_CACHING"], config["WEIR_ADMISSION"], config["WEIR_GC_FREEZE"]) == (
        "false",
        "true",
        "off",
    )
    settings = Settings.from_sources({}, config)
    assert (settings.prefix_caching, settings.admission, settings.gc_freeze) == (False, True, False)
