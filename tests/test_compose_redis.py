"""compose.yaml's Redis access rules on a real redis-server: its ``--user`` lines as compose passes them (with
test secrets), on a server of this test's own (a Unix socket in a temporary folder, and for Celery, whose
URLs name no socket with a password, a free loopback port).

Without a password a client can only PING; each service's user can do what its service does (the dispatcher
and a worker run a stage through the real queue scripts, streams and reaper; the jobs user enqueues a Celery
job) and not what it must not: touch Celery's broker (enqueue a job of its choice) or run admin commands.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import grpc
import pytest
import redis
from celery import Celery
from dispatcher_fakes import dispatcher_server, fake_dependencies, fake_workers, register_engines
from test_compose import SERVICES, redis_options, secret

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from services.common.keys import Keys
from services.common.queue import QueueStore
from services.common.redis_client import connect_tool
from services.jobs.app import make_app
from services.jobs.config import JobsSettings
from services.jobs.tasks import EXPORT_TRACES, PROFILE_ENGINE

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@dataclass(frozen=True, slots=True)
class AclRedis:
    socket: Path
    port: int

    @property
    def url(self) -> str:  # no user: the default one (what fake_dependencies' settings carry)
        return f"unix://{self.socket}"

    def user_url(self, user: str, db: int = 0, password: str | None = None) -> str:
        pw = secret(f"REDIS_{user.upper()}_PASSWORD") if password is None else password
        return f"unix://{user}:{quote(pw)}@{self.socket}?db={db}"

    def tcp_url(self, user: str, db: int) -> str:
        return f"redis://{user}:{secret(f'REDIS_{user.upper()}_PASSWORD')}@127.0.0.1:{self.port}/{db}"

    def client(self, user: str, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.user_url(user, db), decode_responses=True)


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    sock = tmp_path / "redis.sock"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--unixsocket", str(sock)]
    argv += ["--dir", str(tmp_path)]
    for name, args in redis_options(SERVICES["redis"]["command"]):
        argv += [name, *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None, (proc.stdout.read() if proc.stdout else b"").decode()
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        yield AclRedis(sock, port)
    finally:
        proc.terminate()
        proc.wait(10)


def test_without_a_password_only_ping(acl_redis: AclRedis) -> None:
    anonymous = redis.Redis(unix_socket_path=str(acl_redis.socket))
    assert anonymous.ping()
    for command in (("GET", "chimera:engines"), ("SET", "chimera:x", "1"), ("LPUSH", "chimera-jobs:q", "x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            anonymous.execute_command(*command)
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(acl_redis.user_url("dispatcher", password="guess")).ping()


@pytest.mark.parametrize("user", ["dispatcher", "worker"])
def test_dispatcher_and_worker_reach_chimeras_keys_only(acl_redis: AclRedis, user: str) -> None:
    r = acl_redis.client(user)
    r.set("chimera:probe", "1")
    assert r.get("chimera:probe") == "1"
    refused = [
        ("LPUSH", "chimera-jobs:chimera-jobs", "{}"),  # Celery's queue: a job of the caller's choice
        ("GET", "other:key"),
        ("KEYS", "*"),
        ("FLUSHALL",),
        ("CONFIG", "GET", "requirepass"),
        ("ACL", "LIST"),
    ]
    for command in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*command)


def test_only_the_jobs_user_enqueues_jobs(acl_redis: AclRedis) -> None:
    def app(user: str) -> Celery:
        url = acl_redis.tcp_url(user, 1)
        return make_app(JobsSettings(broker_url=url, result_backend=url))

    app("jobs").send_task(EXPORT_TRACES)
    assert acl_redis.client("admin", 1).keys("chimera-jobs:*"), "the job reached no queue"
    with pytest.raises(Exception, match="no permissions"):
        app("worker").send_task(PROFILE_ENGINE, retry=False)


async def test_a_stage_runs_with_the_dispatcher_and_worker_users(acl_redis: AclRedis) -> None:
    keys = Keys("chimera")
    dispatcher_redis = connect_tool(acl_redis.user_url("dispatcher"))  # the product's (cancel-safe) client
    worker_redis = connect_tool(acl_redis.user_url("worker"))
    try:
        await register_engines(worker_redis, keys)
        async with (
            fake_workers(QueueStore(worker_redis, keys)),
            fake_dependencies(acl_redis, keys) as settings,  # type: ignore[arg-type]
            dispatcher_server(settings, dispatcher_redis, keys) as server,
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            stub = dispatcher_pb2_grpc.DispatcherStub(channel)
            req = pb.GenerateRequest(
                program_id="p1",
                stage=0,
                workflow="code/coder",
                messages=[pb.ChatMessage(role="user", content="write a haiku")],
                sampling=pb.SamplingParams(max_tokens=32),
            )
            replies = [r async for r in stub.Generate(req, timeout=20)]
            assert replies[-1].final.text == "Hello"
            end = await stub.EndProgram(pb.EndProgramRequest(program_id="p1"), timeout=10)
            assert end.found
    finally:
        await dispatcher_redis.aclose()
        await worker_redis.aclose()
