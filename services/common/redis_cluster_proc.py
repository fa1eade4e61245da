"""A throwaway Redis Cluster of ``redis-server`` processes on loopback, for the tests and the scale-out
benchmark: three masters with one replica each (six processes), each in its own folder under ``workdir``.

Ports are free ones below the kernel's ephemeral range, each with its cluster bus port (port + 10000) free
too. ``cluster-node-timeout`` is short so that a killed master's replica takes over within a few seconds,
and a replica always may (``cluster-replica-validity-factor 0``: on loopback it is never far behind).
``cluster-require-full-coverage no``: while one master is down, the slots of the other two keep serving.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.common.redis_cluster import startup_nodes_url
from services.common.redis_proc import PERSISTENCE

HOST = "127.0.0.1"
_BUS_OFFSET = 10_000  # Redis Cluster's bus listens on port + 10000


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def free_cluster_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """``n`` ports whose bus ports are free too, both below 32768 (the kernel's usual ephemeral range)."""
    rng = rng or random.Random()
    out: list[int] = []
    while len(out) < n:
        port = rng.randrange(10_000, 32_768 - _BUS_OFFSET)
        if port not in out and _bindable(port) and _bindable(port + _BUS_OFFSET):
            out.append(port)
    return out


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    workdir: Path
    ports: tuple[int, ...]
    node_timeout_ms: int = 2000

    def argv(self, port: int) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make venv` (installs it)")
        return [
            binary,
            "--port",
            str(port),
            "--bind",
            HOST,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-require-full-coverage",
            "no",
            *PERSISTENCE,
            "--dir",
            str(self.workdir / str(port)),
            "--maxclients",
            "4000",
        ]


@dataclass
class RedisClusterProcs:
    """The running nodes, by port; ``url`` is the ``redis+cluster://`` setting that reaches them."""

    spec: ClusterSpec
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return startup_nodes_url([(HOST, p) for p in self.spec.ports])

    def start_node(self, port: int) -> None:
        """Start (or restart, on its own folder and nodes.conf: it rejoins as it left) one node."""
        folder = self.spec.workdir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        log = (folder / "redis.log").open("ab")
        self.procs[port] = subprocess.Popen(self.spec.argv(port), stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self, port: int) -> None:
        """SIGKILL one node, as a crash would."""
        proc = self.procs[port]
        proc.kill()
        proc.wait()

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host=HOST, port=port, decode_responses=True, socket_timeout=2.0)

    def info(self, port: int, what: str) -> dict[str, str]:
        """``CLUSTER INFO`` or ``INFO replication`` of one node, as a dict; {} if it does not answer."""
        client = self.node(port)
        try:
            found = client.cluster("INFO") if what == "cluster" else client.info("replication")
            return {str(k): str(v) for k, v in dict(found).items()}
        except redis.RedisError:
            return {}
        finally:
            client.close()

    def masters(self) -> list[int]:
        """Ports of the live nodes that are masters now."""
        return [p for p, proc in self.procs.items() if proc.poll() is None and self._role(p) == "master"]

    def _in_sync(self, master: int) -> bool:
        rep = self.info(master, "replication")
        # redis-py reads ``slave0:ip=...,state=online,...`` as a dict, turned into its text by ``info``.
        return any(k.startswith("slave") and "online" in v for k, v in rep.items())

    def _role(self, port: int) -> str:
        return self.info(port, "replication").get("role", "")

    def replica_of(self, master: int) -> int | None:
        """The port of a live replica of ``master``."""
        for p, proc in self.procs.items():
            if p != master and proc.poll() is None:
                rep = self.info(p, "replication")
                if rep.get("role") == "slave" and int(rep.get("master_port", 0)) == master:
                    return p
        return None

    def owner(self, key: str) -> int:
        """The port of the master that serves ``key``'s slot now, as a live node sees it."""
        for port, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            client = self.node(port)
            try:
                slot = int(client.cluster("KEYSLOT", key))
                for start, end, master, *_ in client.cluster("SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(master[1])
            except redis.RedisError:
                continue
            finally:
                client.close()
        raise RuntimeError(f"no live node of the cluster knows who serves {key!r}")

    def wait_ok(self, timeout_s: float = 30.0, masters: int = 3, replicated: bool = True) -> None:
        """Until every live node says ``cluster_state:ok``, ``masters`` masters serve the slots and, if
        ``replicated``, each has a replica in sync (a failover needs one)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = [p for p, proc in self.procs.items() if proc.poll() is None]
            states = [self.info(p, "cluster") for p in live]
            if all(s.get("cluster_state") == "ok" and s.get("cluster_size") == str(masters) for s in states):
                up = self.masters()
                if len(up) == masters and (not replicated or all(self._in_sync(m) for m in up)):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the Redis Cluster in {self.spec.workdir} did not become ok in {timeout_s:.0f} s")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_redis_cluster(
    workdir: Path, node_timeout_ms: int = 2000, timeout_s: float = 30.0
) -> RedisClusterProcs:
    """Six nodes, joined by ``redis-cli --cluster create`` as three masters with a replica each; returns once
    the cluster is ok."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli is not installed: run `make venv` (installs it with redis-server)")
    cluster = RedisClusterProcs(ClusterSpec(workdir, tuple(free_cluster_ports(6)), node_timeout_ms))
    try:
        for port in cluster.spec.ports:
            cluster.start_node(port)
        deadline = time.monotonic() + timeout_s
        for port in cluster.spec.ports:
            while not cluster.info(port, "replication"):
                if time.monotonic() > deadline or cluster.procs[port].poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start")
                time.sleep(0.05)
        addrs = [f"{HOST}:{p}" for p in cluster.spec.ports]
        subprocess.run(
            [cli, "--cluster", "create", *addrs, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
        cluster.wait_ok(timeout_s)
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.stop()
        raise
    return cluster
