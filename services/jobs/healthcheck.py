"""Container health checks (compose ``healthcheck``): exit 0 when healthy, 1 otherwise, reason on stderr.

python -m services.jobs.healthcheck grpc 127.0.0.1:50061     # grpc.health.v1 says SERVING
    [--ca-file CA --cert-file CERT --key-file KEY --server-name NAME]   # ... over TLS / mutual TLS
python -m services.jobs.healthcheck heartbeat [ENGINE]       # the worker's heartbeat is fresh and healthy
python -m services.jobs.healthcheck celery                   # this host's jobs worker answers a ping
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

import redis

from services.common.config import CommonSettings
from services.common.health import grpc_unhealthy, heartbeat_unhealthy
from services.common.keys import Keys
from services.common.redis_client import connect_sync
from services.common.tls import ClientTls, client_tls

log = logging.getLogger("healthcheck")


def check_grpc(
    addr: str, timeout_s: float = 2.0, service: str = "", transport: ClientTls | None = None
) -> bool:
    return _report(grpc_unhealthy(addr, timeout_s, service, transport))


def check_heartbeat(r: redis.Redis, keys: Keys, engine: str, max_age_s: float) -> bool:
    return _report(heartbeat_unhealthy(r, keys, engine, max_age_s))


def _report(reason: str | None) -> bool:
    if reason is not None:
        log.error("%s", reason)
    return reason is None


def check_celery(timeout_s: float = 2.0) -> bool:
    from services.jobs.app import NODE, make_app  # Celery is imported only by the check that needs it
    from services.jobs.config import JobsSettings

    app = make_app(JobsSettings())
    replies = app.control.ping(destination=[f"{NODE}@{socket.gethostname()}"], timeout=timeout_s)
    if not replies:
        log.error("jobs worker on %s did not answer", socket.gethostname())
    return bool(replies)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="healthcheck: %(message)s")
    p = argparse.ArgumentParser(prog="python -m services.jobs.healthcheck")
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("grpc")
    g.add_argument("addr")
    g.add_argument("--service", default="")
    g.add_argument("--timeout-s", type=float, default=2.0)
    # A server with TLS on (its *_TLS_CERT_FILE set) is checked over TLS; one that requires client
    # certificates also needs --cert-file and --key-file.
    g.add_argument("--ca-file", type=Path, help="CA bundle (PEM) the server's certificate chains to")
    g.add_argument("--cert-file", type=Path, help="client certificate (PEM), for a server that asks")
    g.add_argument("--key-file", type=Path, help="private key (PEM) of --cert-file")
    g.add_argument("--server-name", default="", help="name the server's certificate is checked against")
    h = sub.add_parser("heartbeat")
    h.add_argument("engine", nargs="?", default=os.environ.get("CHIMERA_WORKER_ENGINE_ID"))
    h.add_argument("--max-age-s", type=float, default=30.0)
    c = sub.add_parser("celery")
    c.add_argument("--timeout-s", type=float, default=2.0)
    a = p.parse_args(argv)
    if a.what == "grpc":
        transport = client_tls(a.ca_file, a.cert_file, a.key_file, a.server_name)
        return 0 if check_grpc(a.addr, a.timeout_s, a.service, transport) else 1
    if a.what == "heartbeat":
        if not a.engine:
            p.error("no engine id: pass one or set CHIMERA_WORKER_ENGINE_ID")
        common = CommonSettings()
        with connect_sync(common.redis_url) as r:
            return 0 if check_heartbeat(r, Keys(common.key_prefix), a.engine, a.max_age_s) else 1
    return 0 if check_celery(a.timeout_s) else 1


if __name__ == "__main__":
    sys.exit(main())
