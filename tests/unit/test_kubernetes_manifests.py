"""The Kubernetes manifests under deploy/kubernetes, checked offline: every resource against the API
schema of one pinned Kubernetes version (strict: unknown fields fail), each kustomization against the
files beside it, every mcp-backfill container against what `mcp-backfill serve` really reads and needs
(probes, shutdown timing, hardening, secrets only as files, real option names and values), and the
selectors of Services, PodDisruptionBudgets and NetworkPolicies against the pods they are meant for."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from mcp_backfill.cli import parse_config
from mcp_backfill.config import SECRET_FILE_VARIABLES
from mcp_backfill.errors import ConfigError
from mcp_backfill.options import BY_FLAG, ENV_PREFIX, OPTIONS, env_var
from mcp_backfill.sidecar.security import matches

# The Kubernetes API the manifests are written for. kubernetes-validate (dev extra) ships its schemas,
# so no network is needed; a release of it that no longer carries this version fails the first test.
KUBERNETES_VERSION = "1.33.0"

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = "kustomization.yaml"
SHAPES = ("sidecar", "gateway")  # the directories that run mcp-backfill
STATE_STORE_DIR = "redis"

IMAGE = "ghcr.io/mcp-backfill/mcp-backfill"
UID = 10001  # the image's USER 10001:10001
HTTP_PORT_NAME = "http"
# Seconds beyond the preStop sleep and the drain for the process to exit (and the kubelet to notice).
SHUTDOWN_MARGIN = 5.0
PRE_STOP = re.compile(r"import time; time\.sleep\((\d+(?:\.\d+)?)\)")
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "namespace", "labels", "patches"}

Resource = dict[str, Any]


# --- reading -------------------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml"))


def manifest_files() -> list[Path]:
    return [path for path in yaml_files() if path.name != KUSTOMIZATION]


def kustomization_dirs() -> list[Path]:
    return sorted(path.parent for path in DEPLOY.rglob(KUSTOMIZATION))


def load(path: Path) -> list[Resource]:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert documents, f"{path.relative_to(ROOT)}: no YAML document"
    for doc in documents:
        assert isinstance(doc, dict), f"{path.relative_to(ROOT)}: a document is not a mapping"
    return documents


def resources(directory: Path) -> list[Resource]:
    return [
        doc for path in sorted(directory.glob("*.yaml")) if path.name != KUSTOMIZATION for doc in load(path)
    ]


def of_kind(docs: list[Resource], kind: str) -> list[Resource]:
    return [doc for doc in docs if doc["kind"] == kind]


def pod_spec(deployment: Resource) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def pod_labels(deployment: Resource) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def image_name(image: str) -> str:
    """`registry/name:tag` or `name@sha256:…` -> the name kustomize's `images:` matches."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def runs_backfill(container: Mapping[str, Any]) -> bool:
    """The container runs mcp-backfill: the image's entrypoint is kept, or names mcp-backfill."""
    command = container.get("command")
    if command:
        return Path(command[0]).name == "mcp-backfill"
    return image_name(container["image"]) == IMAGE


def backfill_pods(shape: str) -> Iterator[tuple[Resource, dict[str, Any]]]:
    """(Deployment, mcp-backfill container) of a shape; at least one, or the checks would prove nothing."""
    found = 0
    for deployment in of_kind(resources(DEPLOY / shape), "Deployment"):
        for container in pod_spec(deployment)["containers"]:
            if runs_backfill(container):
                found += 1
                yield deployment, container
    assert found, f"{shape}: no container runs mcp-backfill"


def env(container: Mapping[str, Any]) -> dict[str, str]:
    variables = container.get("env", [])
    names = [variable["name"] for variable in variables]
    assert len(names) == len(set(names)), f"{container['name']}: an environment variable is set twice"
    return {variable["name"]: variable.get("value", "") for variable in variables}


def pre_stop_sleep(container: Mapping[str, Any]) -> float:
    """The seconds of `preStop: exec: [python, -c, "import time; time.sleep(N)"]` (the image has no shell)."""
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    assert command is not None, f"{container['name']}: no preStop exec hook"
    assert command[:2] == ["python", "-c"], f"{container['name']}: {command}"
    assert len(command) == 3, f"{container['name']}: {command}"
    found = PRE_STOP.fullmatch(command[2])
    assert found, f"{container['name']}: preStop is not a plain sleep: {command[2]!r}"
    return float(found.group(1))


def state_store_env() -> str:
    return env_var("--state-store")


def drain_timeout(container: Mapping[str, Any]) -> float:
    name = env_var("--drain-timeout")
    raw = env(container).get(name)
    assert raw, f"{container['name']}: set {name} explicitly, the grace period depends on it"
    seconds: float = BY_FLAG["--drain-timeout"].convert(raw)
    return seconds


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels/matchExpressions) against a pod's labels."""
    if not all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        held = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not held:
            return False
    return True


def non_empty(selector: Mapping[str, Any]) -> bool:
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


# --- 1. the API schema -----------------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connection can be opened: the validation must not fetch a schema."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the manifest validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_pinned_kubernetes_version_has_schemas_here() -> None:
    # validate() silently falls back to the newest older schema set; the pin must be there itself.
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


def test_there_are_manifests() -> None:
    assert {path.parent.name for path in manifest_files()} == {*SHAPES, STATE_STORE_DIR}
    assert not list(DEPLOY.rglob("*.yml")), "name YAML files *.yaml (the checks read only those)"


@pytest.mark.usefixtures("offline")
@pytest.mark.parametrize("path", manifest_files(), ids=lambda path: str(path.relative_to(DEPLOY)))
def test_manifests_validate_strictly_against_the_kubernetes_api(path: Path) -> None:
    for doc in load(path):
        try:
            validated = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(part) for part in exc.path)
            pytest.fail(f"{path.relative_to(ROOT)}: {doc['kind']} {where}: {exc.message}")
        assert validated == KUBERNETES_VERSION.rsplit(".", 1)[0]


# --- 2. the kustomizations -------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda path: path.name)
def test_kustomization_lists_exactly_the_files_beside_it(directory: Path) -> None:
    [kustomization] = load(directory / KUSTOMIZATION)
    assert set(kustomization) <= KUSTOMIZATION_KEYS, set(kustomization) - KUSTOMIZATION_KEYS
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    beside = {path.name for path in directory.glob("*.yaml") if path.name != KUSTOMIZATION}
    assert set(listed) == beside, f"forgotten: {beside - set(listed)}, missing: {set(listed) - beside}"
    docs = resources(directory)  # they parse
    used = {image_name(c["image"]) for d in of_kind(docs, "Deployment") for c in pod_spec(d)["containers"]}
    for image in kustomization.get("images", []):
        assert image["name"] in used, f"images: {image['name']} is no container's image"


def test_every_directory_with_manifests_has_a_kustomization() -> None:
    assert {path.parent for path in manifest_files()} == set(kustomization_dirs())


# --- 3. the mcp-backfill containers ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_backfill_serves_http_on_all_interfaces_of_the_pod(shape: str) -> None:
    for _deployment, container in backfill_pods(shape):
        assert container.get("args", ["serve"]) == ["serve"]
        variables = env(container)
        assert variables.get(env_var("--host")) == "0.0.0.0", "the default 127.0.0.1 is unreachable in a pod"
        [port] = [port for port in container["ports"] if port.get("name") == HTTP_PORT_NAME]
        assert str(port["containerPort"]) == variables.get(env_var("--port")) == "8080"


@pytest.mark.parametrize("shape", SHAPES)
def test_backfill_probes_healthz_and_readyz_with_an_allowed_host(shape: str) -> None:
    for _deployment, container in backfill_pods(shape):
        allowed = BY_FLAG["--allowed-hosts"].convert(env(container).get(env_var("--allowed-hosts"), ""))
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            http_get = container.get(probe, {}).get("httpGet")
            assert http_get is not None, f"{probe}: not an httpGet probe"
            assert http_get["path"] == path
            assert http_get["port"] in (HTTP_PORT_NAME, 8080)
            # Every path is Host-checked; without the header the kubelet sends the pod's IP and gets 403.
            hosts = [h["value"] for h in http_get.get("httpHeaders", []) if h["name"].lower() == "host"]
            assert hosts, f"{probe}: no Host header"
            assert allowed, f"{env_var('--allowed-hosts')} is unset, so only loopback names would pass"
            assert all(matches(host, allowed) for host in hosts), f"{probe}: Host {hosts} not in {allowed}"


@pytest.mark.parametrize("shape", SHAPES)
def test_grace_period_covers_pre_stop_and_drain(shape: str) -> None:
    for deployment, container in backfill_pods(shape):
        spec = pod_spec(deployment)
        grace = spec.get("terminationGracePeriodSeconds", 30)
        drained_at = pre_stop_sleep(container) + drain_timeout(container)
        assert grace >= drained_at + SHUTDOWN_MARGIN, f"grace {grace} s < {drained_at} s + margin"
        # A second container of the pod (the MCP server) must outlive the drain that still uses it.
        for other in spec["containers"]:
            if other is not container:
                outlives = pre_stop_sleep(other)
                assert outlives >= drained_at, f"{other['name']} stops at {outlives} s, the drain ends later"
                assert grace >= outlives + SHUTDOWN_MARGIN, f"{other['name']}: grace {grace} s too short"


def all_deployments() -> list[tuple[str, Resource]]:
    return [
        (str(path.relative_to(DEPLOY)), doc)
        for path in manifest_files()
        for doc in load(path)
        if doc["kind"] == "Deployment"
    ]


@pytest.mark.parametrize(("where", "deployment"), all_deployments(), ids=[w for w, _ in all_deployments()])
def test_every_pod_is_hardened(where: str, deployment: Resource) -> None:
    spec = pod_spec(deployment)
    assert spec.get("automountServiceAccountToken") is False
    # Service links put e.g. MCP_BACKFILL_PORT=tcp://… (Service `mcp-backfill`) in the environment.
    assert spec.get("enableServiceLinks") is False
    pod = spec.get("securityContext", {})
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    for container in spec["containers"]:
        context = {**pod, **container.get("securityContext", {})}  # the container's own fields win
        name = container["name"]
        assert context.get("runAsNonRoot") is True, name
        assert context.get("readOnlyRootFilesystem") is True, name
        assert context.get("allowPrivilegeEscalation") is False, name
        assert context.get("capabilities", {}).get("drop") == ["ALL"], name
        assert not context.get("capabilities", {}).get("add"), name
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        assert context.get("privileged") is not True, name
        if runs_backfill(container):
            assert (context.get("runAsUser"), context.get("runAsGroup")) == (UID, UID), name
            tmp = [mount for mount in container.get("volumeMounts", []) if mount["mountPath"] == "/tmp"]
            assert tmp, f"{name}: a read-only root needs a writable /tmp"
            assert "emptyDir" in volumes[tmp[0]["name"]], name
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            assert set(resources.get(bound, {})) >= {"cpu", "memory"}, f"{name}: resources.{bound}"


@pytest.mark.parametrize(("where", "deployment"), all_deployments(), ids=[w for w, _ in all_deployments()])
def test_secrets_are_files_never_environment_values(where: str, deployment: Resource) -> None:
    spec = pod_spec(deployment)
    secret_volumes = {v["name"] for v in spec.get("volumes", []) if "secret" in v or "projected" in v}
    for container in spec["containers"]:
        assert "envFrom" not in container, f"{container['name']}: envFrom can carry a secret value"
        secret_dirs = [
            mount["mountPath"]
            for mount in container.get("volumeMounts", [])
            if mount["name"] in secret_volumes and mount.get("readOnly") is True
        ]
        for name, value in env(container).items():
            # The state store's URL is a secret only with a password in it (refused below for any value).
            if name != state_store_env():
                assert name not in SECRET_FILE_VARIABLES, f"{name}: use {name}_FILE and a Secret volume"
            if name.endswith("_FILE") and name.removesuffix("_FILE") in SECRET_FILE_VARIABLES:
                assert any(value.startswith(f"{d.rstrip('/')}/") for d in secret_dirs), f"{name}={value}"
            assert not urlsplit(value).password, f"{name}: a password in a URL"
        for variable in container.get("env", []):
            source = variable.get("valueFrom", {})
            assert "secretKeyRef" not in source, f"{variable['name']}: a Secret's value in the environment"


def known_env_names() -> set[str]:
    options = {env_var(option.flag) for option in OPTIONS}
    return options | {f"{name}_FILE" for name in SECRET_FILE_VARIABLES}


@pytest.mark.parametrize("shape", SHAPES)
def test_backfill_env_names_are_real_options_with_valid_values(shape: str) -> None:
    known = known_env_names()
    by_env = {env_var(option.flag): option for option in OPTIONS}
    for _deployment, container in backfill_pods(shape):
        ours = {name: value for name, value in env(container).items() if name.startswith(ENV_PREFIX)}
        ours |= {name: value for name, value in env(container).items() if name.startswith("ANTHROPIC_")}
        unknown = sorted(set(ours) - known)
        problems = []
        for name, value in ours.items():
            if name in by_env:
                option = by_env[name]
                try:
                    problem = option.problem(option.convert(value))
                except ConfigError as exc:
                    problem = str(exc)
                if problem is not None:
                    problems.append(problem)
        # Unknown names (not options of mcp-backfill) and invalid values, both reported at once.
        assert (unknown, problems) == ([], []), f"not options: {unknown}; invalid values: {problems}"


@pytest.mark.parametrize("shape", SHAPES)
def test_serve_accepts_the_whole_environment(shape: str, tmp_path: Path) -> None:
    """The cross-field rules too (e.g. a non-loopback host needs a token): `serve` would start."""
    for _deployment, container in backfill_pods(shape):
        environ = env(container)
        for name, path in list(environ.items()):
            if name.endswith("_FILE"):  # the Secret's file, here with a stand-in value
                stand_in = tmp_path / Path(path).name
                stand_in.write_text("x" * 64 + "\n")
                environ[name] = str(stand_in)
        config = parse_config(container.get("args", ["serve"]), environ)
        assert config.host == "0.0.0.0"
        assert config.drain_timeout == drain_timeout(container)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_state_store_is_the_redis_service(shape: str) -> None:
    [service] = of_kind(resources(DEPLOY / STATE_STORE_DIR), "Service")
    for _deployment, container in backfill_pods(shape):
        url = urlsplit(env(container).get(state_store_env(), ""))
        assert url.scheme == "redis"
        assert url.hostname == service["metadata"]["name"]
        assert url.port in [port["port"] for port in service["spec"]["ports"]]


# --- 4. selectors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda path: path.name)
def test_selectors_match_the_pods_of_their_directory(directory: Path) -> None:
    docs = resources(directory)
    deployments = of_kind(docs, "Deployment")
    assert deployments
    pods = [pod_labels(deployment) for deployment in deployments]
    for deployment in deployments:
        assert selects(deployment["spec"]["selector"], pod_labels(deployment))
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "Service":
            selector = {"matchLabels": doc["spec"]["selector"]}
        elif kind == "PodDisruptionBudget":
            selector = doc["spec"]["selector"]
        elif kind == "NetworkPolicy":
            selector = doc["spec"]["podSelector"]
        else:
            continue
        assert non_empty(selector), f"{kind} {name}: an empty selector selects every pod"
        assert any(selects(selector, labels) for labels in pods), f"{kind} {name} selects no pod here"
    for deployment in deployments:
        labels, replicas = pod_labels(deployment), deployment["spec"].get("replicas", 1)
        policies = [p for p in of_kind(docs, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)]
        assert policies, "no NetworkPolicy for the pods"
        assert all(set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} for p in policies)
        budgets = [b for b in of_kind(docs, "PodDisruptionBudget") if selects(b["spec"]["selector"], labels)]
        if replicas > 1:
            assert budgets, "more than one replica and no PodDisruptionBudget"
        for budget in budgets:  # one that can never be met blocks every node drain
            assert budget["spec"].get("minAvailable", 0) < replicas


def container_port_names(deployment: Resource) -> set[str]:
    return {p["name"] for c in pod_spec(deployment)["containers"] for p in c.get("ports", []) if "name" in p}


@pytest.mark.parametrize("shape", SHAPES)
def test_only_the_http_port_is_reachable(shape: str) -> None:
    docs = resources(DEPLOY / shape)
    [deployment] = of_kind(docs, "Deployment")
    assert container_port_names(deployment) == {HTTP_PORT_NAME}
    [service] = of_kind(docs, "Service")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8080, HTTP_PORT_NAME)]
    [policy] = of_kind(docs, "NetworkPolicy")
    for rule in policy["spec"]["ingress"]:
        assert rule.get("ports"), "an ingress rule without ports opens every port"
        assert all(port["port"] in (HTTP_PORT_NAME, 8080) for port in rule["ports"])


def peers_on_port(rules: list[dict[str, Any]], direction: str, port: int | str) -> list[dict[str, Any]]:
    return [
        peer
        for rule in rules
        if any(p["port"] == port for p in rule.get("ports", []))
        for peer in rule.get(direction, [])
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_backfill_and_redis_policies_let_each_other_through(shape: str) -> None:
    redis_docs = resources(DEPLOY / STATE_STORE_DIR)
    [redis] = of_kind(redis_docs, "Deployment")
    [redis_policy] = of_kind(redis_docs, "NetworkPolicy")
    [backfill] = of_kind(resources(DEPLOY / shape), "Deployment")
    [backfill_policy] = of_kind(resources(DEPLOY / shape), "NetworkPolicy")
    to_redis = peers_on_port(backfill_policy["spec"]["egress"], "to", 6379)
    assert any(selects(peer["podSelector"], pod_labels(redis)) for peer in to_redis if "podSelector" in peer)
    from_backfill = peers_on_port(redis_policy["spec"]["ingress"], "from", "redis")
    assert from_backfill
    assert all(set(peer) == {"podSelector"} for peer in from_backfill), "from this namespace only"
    assert any(selects(peer["podSelector"], pod_labels(backfill)) for peer in from_backfill)
