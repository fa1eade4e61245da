"""deploy/kubernetes/ cannot be applied here (no cluster), so it is rendered and checked offline, as
tests/test_compose.py checks compose.yaml.

1. Rendered (tests/kustomize.py; the same output as ``kubectl kustomize`` where kubectl is installed) and
   every object validated against the Kubernetes JSON schema of ``K8S_VERSION`` (``kubernetes-validate``,
   strict: unknown fields are errors).
2. Kept in step with compose.yaml: each container runs compose's command with compose's environment, health
   check and volumes, and Redis has compose's persistence and ACL users.
3. Checked against the code: modules exist, every ``CHIMERA_*`` variable is a settings field the service
   accepts, ports are the settings' defaults, probes are real health-check subcommands.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import typer
import yaml
from kustomize import Doc, Unsupported, pod_spec, render, split_image
from test_compose import (
    ACTS_AS,
    REDIS_CLIENTS,
    SECRETS,
    SERVICES,
    URL_VARS,
    acl_users,
    env_names,
    environment,
    interpolate,
    module_of,
    owner,
    redis_options,
    secret,
    settings_class,
)

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
# The Kubernetes version whose schema the manifests are validated against (kubernetes-validate ships it).
# 1.31: every API used (apps/v1, batch/v1, autoscaling/v2, exec probes) is GA there and in every later one.
K8S_VERSION = "1.31.0"
# Each workload and the compose service it mirrors.
MIRRORS = {
    "redis": "redis",
    "bootstrap": "bootstrap",
    "router": "router",
    "predictor": "predictor",
    "dispatcher": "dispatcher",
    "jobs": "jobs",
    "worker-0": "worker-0",
    "worker-1": "worker-1",
}
# Claims the operator creates (README, "On Kubernetes"); every other claim is rendered.
OPERATOR_CLAIMS = {"chimera-models"}
# Variables that are not Chimera's settings but compose sets too, so they are compared as well.
OTHER_ENV = {"CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE"}
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_ALTERNATE = re.compile(r"\$\{\w+:?\+[^}]*\}")  # ${X:+word}: empty while X is unset, as by default

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/kubernetes/ with the secrets.env an operator writes (never committed): the values
    deploy/make-env.sh would write, as tests/test_compose.py's ``secret`` draws them."""
    out = tmp_path_factory.mktemp("kube") / "kubernetes"
    shutil.copytree(KUBE, out, ignore=shutil.ignore_patterns("secrets.env"))
    (out / "base" / "secrets.env").write_text("".join(f"{v}={secret(v)}\n" for v in sorted(SECRETS)))
    return out


@pytest.fixture(scope="module")
def gpu(tree: Path) -> list[Doc]:
    return render(tree / "overlays" / "gpu")


@pytest.fixture(scope="module")
def base(tree: Path) -> list[Doc]:
    return render(tree / "base")


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workloads(docs: list[Doc]) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if pod_spec(d) is not None}


def container(doc: Doc) -> dict[str, Any]:
    spec = pod_spec(doc)
    assert spec is not None
    (c,) = spec["containers"]  # one container per pod: no sidecars here
    return dict(c)


def resolve_env(docs: list[Doc], c: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in order, each
    ``$(VAR)`` expanded from what is defined before it; secrets are the rendered Secret's values."""
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        env |= find(docs, "ConfigMap", src["configMapRef"]["name"])["data"]
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
            continue
        ref = item["valueFrom"]
        if "secretKeyRef" in ref:
            data = find(docs, "Secret", ref["secretKeyRef"]["name"])["data"]
            env[item["name"]] = base64.b64decode(data[ref["secretKeyRef"]["key"]]).decode()
        else:
            data = find(docs, "ConfigMap", ref["configMapKeyRef"]["name"])["data"]
            env[item["name"]] = data[ref["configMapKeyRef"]["key"]]
    return env


def compose_value(value: object) -> str:
    """A compose value with no overrides (test_compose's ``interpolate``, plus ``${X:+word}``)."""
    return interpolate(_ALTERNATE.sub("", str(value)))


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion; an undefined reference stays as written, so it shows in a diff."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def argv(c: dict[str, Any], env: dict[str, str]) -> list[str]:
    return [expand(a, env) for a in c.get("command", []) + c.get("args", [])]


def probes(c: dict[str, Any]) -> dict[str, list[str]]:
    return {k: c[k]["exec"]["command"] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c}


def normal(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    """Objects by kind and name, Secret data decoded (kubectl wraps long base64 lines)."""
    out = {}
    for d in docs:
        if d["kind"] == "Secret":
            d = {**d, "data": {k: base64.b64decode(v).decode() for k, v in d["data"].items()}}
        out[(d["kind"], d["metadata"]["name"])] = d
    return out


# --- rendering and the schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["base", "overlays/gpu"])
def test_renderer_agrees_with_kubectl_kustomize(tree: Path, layer: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; tests/kustomize.py renders alone")
    proc = subprocess.run(
        [kubectl, "kustomize", str(tree / layer)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    theirs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert normal(render(tree / layer)) == normal(theirs)


def test_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: [{path: p.yaml}]\n")
    with pytest.raises(Unsupported, match="patches"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("secretGenerator: [{name: s, envs: [a.env]}]\n")
    with pytest.raises(Unsupported, match="disableNameSuffixHash"):
        render(tmp_path)


def test_rendering_needs_the_operators_secrets(tmp_path: Path) -> None:
    """Like compose without .env: no secrets.env, no manifests (and none is ever committed)."""
    shutil.copytree(KUBE, tmp_path / "k", ignore=shutil.ignore_patterns("secrets.env"))
    with pytest.raises(FileNotFoundError, match="secrets.env"):
        render(tmp_path / "k" / "overlays" / "gpu")
    committed = subprocess.run(
        ["git", "ls-files", str(KUBE)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert committed, "deploy/kubernetes is not committed"
    assert not [f for f in committed if f.endswith("secrets.env")]
    ignored = subprocess.run(["git", "check-ignore", "-q", str(KUBE / "base" / "secrets.env")], cwd=ROOT)
    assert ignored.returncode == 0, "base/secrets.env is not ignored by git"
    for path in KUBE.rglob("*.yaml"):
        for d in yaml.safe_load_all(path.read_text()):
            assert not (d or {}).get("kind") == "Secret", f"{path} commits a Secret"


@pytest.mark.parametrize("layer", ["base", "overlays/gpu"])
def test_every_object_follows_the_kubernetes_schema(tree: Path, layer: str) -> None:
    docs = render(tree / layer)
    assert docs
    for d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")


def test_the_schema_check_would_catch_a_mistake(gpu: list[Doc]) -> None:
    doc = find(gpu, "Deployment", "dispatcher")
    broken = {**doc, "spec": {**doc["spec"], "replica": 1}}  # a typo kubectl would reject
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_every_object_is_in_the_namespace_and_images_are_pinned_by_the_kustomization(gpu: list[Doc]) -> None:
    for d in gpu:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "chimera", d["metadata"]["name"]
    for name, w in workloads(gpu).items():
        image = container(w)["image"]
        assert split_image(image)[1], f"{name} runs {image} without a tag"


# --- kept in step with compose.yaml ---------------------------------------------------------------------


def test_the_gpu_overlay_runs_every_compose_service_but_the_monitoring(gpu: list[Doc]) -> None:
    """Prometheus and Grafana are the cluster's (pods carry scrape annotations); first-key is
    `kubectl exec` (see test_first_key_is_made_from_the_dispatcher_pod)."""
    assert set(workloads(gpu)) == set(MIRRORS)
    assert set(SERVICES) - set(MIRRORS.values()) == {"prometheus", "grafana", "first-key"}


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_workload_runs_composes_command_environment_and_health_check(gpu: list[Doc], name: str) -> None:
    service = SERVICES[MIRRORS[name]]
    c = container(workloads(gpu)[name])
    env = resolve_env(gpu, c)
    assert argv(c, env) == [compose_value(a) for a in service["command"]], f"{name} runs another command"
    ours = {k: v for k, v in env.items() if k.startswith("CHIMERA_") or k in OTHER_ENV}
    theirs = {k: v for k, v in environment(service).items() if k.startswith("CHIMERA_") or k in OTHER_ENV}
    if name == "redis":  # compose writes the key prefix into Redis's command line; here it is read from env
        ours.pop("CHIMERA_KEY_PREFIX")
    assert ours == theirs, f"{name}'s environment differs from compose's"
    if "healthcheck" in service:
        check = service["healthcheck"]["test"][1:]  # after "CMD"
        got = probes(c)
        assert got and all(cmd == check for cmd in got.values()), f"{name}'s probes are not compose's check"
        assert "readinessProbe" in got or "livenessProbe" in got
    # compose's volumes are mounted at the same paths, read-only where compose's are.
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in c.get("volumeMounts", [])}
    for v in service.get("volumes", []):
        target, _, mode = compose_value(v).split(":", 1)[1].partition(":")
        assert mounts.get(target) == (mode == "ro"), f"{name} mounts {target} unlike compose"


def test_redis_persists_and_has_composes_users(gpu: list[Doc]) -> None:
    from services.common.redis_proc import PERSISTENCE

    redis = find(gpu, "StatefulSet", "redis")
    c = container(redis)
    cmd = argv(c, resolve_env(gpu, c))
    flags = {n: a[0] for n, a in redis_options(cmd) if len(a) == 1}
    assert {k: flags.get(k) for k in PERSISTENCE[::2]} == dict(
        zip(PERSISTENCE[::2], PERSISTENCE[1::2], strict=True)
    )
    # The same ACL users, rules and passwords as compose's, once the Secret and the ConfigMap are read.
    assert {a[0]: a[1:] for n, a in redis_options(cmd) if n == "--user"} == acl_users()
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in c["volumeMounts"]


def test_each_client_logs_in_to_redis_as_its_own_user(gpu: list[Doc]) -> None:
    service = find(gpu, "Service", "redis")
    port = service["spec"]["ports"][0]["port"]
    for name, w in workloads(gpu).items():
        env = resolve_env(gpu, container(w))
        module = module_of(container(w))
        kind = module.split(".")[1] if module else ""
        if kind in REDIS_CLIENTS:
            assert "CHIMERA_REDIS_URL" in env, f"{name} uses Redis without credentials"
        for var in (v for v in URL_VARS if v in env):
            url = urlsplit(env[var])
            assert (url.username, url.hostname, url.port) == (kind, "redis", port), f"{name}.{var}"
            assert url.password == secret(f"REDIS_{kind.upper()}_PASSWORD"), f"{name}.{var}"


# --- checked against the code ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(set(MIRRORS) - {"redis"}))
def test_every_variable_is_a_config_field_and_the_service_accepts_them(
    gpu: list[Doc], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = container(workloads(gpu)[name])
    module = module_of(c)
    assert module and module.startswith("services.")
    env = {k: v for k, v in resolve_env(gpu, c).items() if k.startswith("CHIMERA_")}
    for var in env:
        cls = settings_class(owner(var))
        assert var.upper() in env_names(cls), f"{name} sets {var}, which {cls.__name__} does not read"
    cls = settings_class(module.split(".")[1] if module != "services.cli.main" else "common")
    for k in [k for k in os.environ if k.startswith("CHIMERA_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cls()


def test_ports_are_the_settings_defaults_and_services_reach_them(gpu: list[Doc]) -> None:
    wanted = {"grpc": "port", "http": "http_port", "metrics": "metrics_port"}
    for name, w in workloads(gpu).items():
        c = container(w)
        module = module_of(c)
        if not module or module == "services.cli.main":
            continue
        cls = settings_class(module.split(".")[1])
        for p in c.get("ports", []):
            field = cls.model_fields[wanted[p["name"]]]
            assert p["containerPort"] == field.default, f"{name} exposes {p['name']} on another port"
        # Every pod with /metrics is scraped; the annotation names its metrics port.
        annotations = w["spec"]["template"]["metadata"].get("annotations", {})
        metrics = [p["containerPort"] for p in c.get("ports", []) if p["name"] == "metrics"]
        if "metrics_port" in cls.model_fields:
            assert metrics == [cls.model_fields["metrics_port"].default], f"{name} hides its /metrics"
        if metrics:
            assert annotations.get("prometheus.io/scrape") == "true", name
            assert annotations.get("prometheus.io/port") == str(metrics[0]), name
            assert annotations.get("prometheus.io/path") == "/metrics", name
    services = {d["metadata"]["name"]: d for d in gpu if d["kind"] == "Service"}
    for svc in services.values():
        (target,) = [
            w for w in workloads(gpu).values()
            if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        named = {p["name"] for p in container(target).get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in named, f"{svc['metadata']['name']} targets {p['targetPort']}"
    # The dispatcher's upstream addresses are Service names and ports; its Service carries both doors.
    env = resolve_env(gpu, container(workloads(gpu)["dispatcher"]))
    for upstream in ("router", "predictor"):
        host, port = env[f"CHIMERA_DISPATCHER_{upstream.upper()}_ADDR"].split(":")
        assert host in services
        assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
    dispatcher = settings_class("dispatcher")
    assert {p["port"] for p in services["dispatcher"]["spec"]["ports"]} == {
        dispatcher.model_fields[f].default for f in ("port", "http_port")
    }


def test_probes_call_real_health_check_subcommands(gpu: list[Doc]) -> None:
    from services.jobs import healthcheck

    for name, w in workloads(gpu).items():
        for probe, cmd in probes(container(w)).items():
            if cmd[:3] != ["python", "-m", "services.jobs.healthcheck"]:
                assert name == "redis" and cmd == ["redis-cli", "ping"], f"{name}.{probe}: {cmd}"
                continue
            with pytest.raises(SystemExit) as e:
                healthcheck.main([*cmd[3:], "--help"])
            assert e.value.code == 0, f"{name}.{probe}: {cmd}"


def test_pods_run_as_the_images_user_without_privileges(gpu: list[Doc]) -> None:
    (uid,) = re.findall(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text())
    for name, w in workloads(gpu).items():
        spec = pod_spec(w)
        assert spec is not None
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, name
        c = container(w)
        if split_image(c["image"])[0] in {"chimera", "chimera-gpu"}:
            assert pod["runAsUser"] == int(uid), (
                f"{name} runs as {pod['runAsUser']}, the image's user is {uid}"
            )
        assert spec["automountServiceAccountToken"] is False, f"{name} may call the Kubernetes API"
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), f"{name} requests no resources"


def test_images_are_the_dockerfiles_targets_as_compose_names_them(gpu: list[Doc]) -> None:
    images = {
        interpolate(s["image"]).split(":")[0]: s["build"]["target"] for s in SERVICES.values() if "build" in s
    }
    assert images == {"chimera": "cpu", "chimera-gpu": "gpu"}
    for name, w in workloads(gpu).items():
        image = split_image(container(w)["image"])[0]
        compose = SERVICES[MIRRORS[name]]
        assert image == ("redis" if name == "redis" else interpolate(compose["image"]).split(":")[0]), name


def test_one_gpu_per_worker_and_every_model_bootstrapped(gpu: list[Doc], base: list[Doc]) -> None:
    workers = {n: w for n, w in workloads(gpu).items() if module_of(container(w)) == "services.worker"}
    assert len(workers) >= 2 and not [n for n in workloads(base) if n in workers], "workers are the overlay's"
    bootstrap = container(workloads(gpu)["bootstrap"])["command"]
    bootstrapped = {bootstrap[i + 1].partition("=")[0] for i, a in enumerate(bootstrap) if a == "--model"}
    engines = set()
    for name, w in workers.items():
        c, spec = container(w), pod_spec(w)
        assert spec is not None
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1, name
        assert c["resources"]["requests"].get("nvidia.com/gpu", 1) == 1, name
        assert w["spec"]["replicas"] == 1 and w["spec"]["strategy"]["type"] == "Recreate", name
        env = resolve_env(gpu, c)
        engines.add(env["CHIMERA_WORKER_ENGINE_ID"])
        assert env["CHIMERA_WORKER_MODEL"] in bootstrapped, (
            f"{name}'s model has no first router/predictor model"
        )
        # vLLM's processes share tensors through /dev/shm: a memory volume, not the pod's 64 MiB default.
        (mount,) = [m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        shm = next(v for v in spec["volumes"] if v["name"] == mount)
        assert shm["emptyDir"]["medium"] == "Memory", name
    assert len(engines) == len(workers), "engine ids must be distinct"


def test_every_claim_is_rendered_or_the_operators(gpu: list[Doc]) -> None:
    claims = {d["metadata"]["name"] for d in gpu if d["kind"] == "PersistentVolumeClaim"}
    used = set()
    for w in workloads(gpu).values():
        spec = pod_spec(w)
        assert spec is not None
        used |= {
            v["persistentVolumeClaim"]["claimName"]
            for v in spec.get("volumes", [])
            if "persistentVolumeClaim" in v
        }
    assert used - claims == OPERATOR_CLAIMS
    readme = (ROOT / "README.md").read_text()
    assert all(c in readme for c in OPERATOR_CLAIMS), "the README does not tell the operator to create it"


def test_dispatcher_autoscales_on_cpu(gpu: list[Doc]) -> None:
    hpa = find(gpu, "HorizontalPodAutoscaler", "dispatcher")
    deployment = find(gpu, "Deployment", "dispatcher")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "dispatcher")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert "cpu" in container(deployment)["resources"]["requests"], "utilization needs a CPU request"
    # The autoscaler owns the count: a replicas field would be reset on every apply.
    assert "replicas" not in deployment["spec"]
    assert 1 == hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    # Several replicas share nothing but Redis (tests/test_replicas.py): each names itself HOST:PID unless
    # told otherwise, and a pod's hostname is its own name, so no two replicas share a name.
    env = resolve_env(gpu, container(deployment))
    assert "CHIMERA_DISPATCHER_REPLICA" not in env
    assert settings_class("dispatcher").model_fields["replica"].default == ""


def test_first_key_is_made_from_the_dispatcher_pod(gpu: list[Doc]) -> None:
    """compose's first-key writes the key to a volume; here the operator runs the CLI in the dispatcher's
    pod, which logs in as the user first-key acts as, and the key is printed once to the operator."""
    from services.cli.main import app

    readme = (ROOT / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if "kubectl" in ln and "keys create" in ln]
    cmd = line.split(" -- ", 1)[1].split("#")[0].split()
    assert "exec deploy/dispatcher" in line and cmd[:3] == ["python", "-m", "services.cli.main"]
    env = resolve_env(gpu, container(find(gpu, "Deployment", "dispatcher")))
    assert urlsplit(env["CHIMERA_REDIS_URL"]).username == ACTS_AS["first-key"]
    # The command parses as the CLI's: `keys create` with options it has (an unknown one raises).
    node: Any = typer.main.get_command(app)
    for name in cmd[3:5]:
        node = node.get_command(node.make_context(name, [], resilient_parsing=True), name)
        assert node is not None, f"the CLI has no {name} command"
    node.make_context("create", cmd[5:])
