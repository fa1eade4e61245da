"""Transport security on real processes, with certificates made for each test (``tls_certs``).

- The dispatcher (``python -m services.dispatcher``) with a certificate serves TLS on both doors: a client
  that trusts the CA gets answers on gRPC and HTTPS; a plaintext client and a client that does not trust the
  CA are refused.
- The router and the predictor with a client CA serve only clients with a certificate that CA signs: the
  dispatcher's own clients (``services.dispatcher.clients`` over ``services.common.tls`` channels, as its
  ``__main__`` builds them) get answers with one, and are refused without one, with another CA's, or in
  plaintext; so is the container health check.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from service_proc import Service, dispatcher_env
from test_router_process import _fake_rows
from tls_certs import Pki, make_pki

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc
from chimera_client import NO_RETRY, Client, tls_credentials
from services.common import tls
from services.common.health import grpc_unhealthy
from services.common.keys import Keys
from services.common.redis_proc import PrivateRedis
from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.dispatcher.clients import PredictorClient, RouterClient, UpstreamError
from services.dispatcher.config import DispatcherSettings
from services.jobs import healthcheck
from services.predictor.training import train_predictor
from services.router.config import RouterSettings
from services.router.training import train_router

pytestmark = pytest.mark.timeout(180)

_SERVING = re.compile(r"serving on \S+:(\d+) \((.+)\)")
_HTTP = re.compile(r"HTTP on (https?)://\S+:(\d+)/v1")


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(10)


# --- settings ---------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_half_configured_tls_stops_the_service_at_start_up(pki: Pki) -> None:
    with pytest.raises(
        ValidationError, match="CHIMERA_DISPATCHER_TLS_CERT_FILE and CHIMERA_DISPATCHER_TLS_KEY"
    ):
        DispatcherSettings(tls_cert_file=pki.server.cert)
    with pytest.raises(ValidationError, match="CHIMERA_DISPATCHER_UPSTREAM_TLS_CERT_FILE"):
        DispatcherSettings(upstream_tls_ca_file=pki.ca, upstream_tls_key_file=pki.client.key)
    with pytest.raises(ValidationError, match="CHIMERA_ROUTER_TLS_CLIENT_CA_FILE needs"):
        RouterSettings(tls_client_ca_file=pki.ca)
    with pytest.raises(ValidationError, match="tls_cert_file"):  # a path that is not a file
        RouterSettings(tls_cert_file=pki.ca.parent / "missing.crt", tls_key_file=pki.server.key)
    # Unset is plaintext, everywhere.
    s = DispatcherSettings()
    assert tls.server_tls(s.tls_cert_file, s.tls_key_file) is None
    assert tls.client_tls(s.upstream_tls_ca_file, s.upstream_tls_cert_file, s.upstream_tls_key_file) is None
    assert tls.uvicorn_ssl(None) == {}


@pytest.mark.unit
def test_uvicorn_asks_for_client_certificates_only_when_mutual(pki: Pki) -> None:
    one_way = tls.uvicorn_ssl(tls.server_tls(pki.server.cert, pki.server.key))
    assert one_way == {"ssl_certfile": str(pki.server.cert), "ssl_keyfile": str(pki.server.key)}
    mutual = tls.uvicorn_ssl(tls.server_tls(pki.server.cert, pki.server.key, pki.ca))
    assert mutual["ssl_cert_reqs"] == ssl.CERT_REQUIRED and mutual["ssl_ca_certs"] == str(pki.ca)


# --- the dispatcher's doors -------------------------------------------------------------------------------


@pytest.mark.e2e
def test_both_doors_serve_tls_and_refuse_plaintext(
    private_redis: PrivateRedis, keys: Keys, pki: Pki, services: list[Service]
) -> None:
    env = dispatcher_env(
        private_redis.url,
        keys.prefix,
        tls_cert_file=str(pki.server.cert),
        tls_key_file=str(pki.server.key),
        grace_s="1",
    )
    d = Service("services.dispatcher", env)
    services.append(d)
    serving = d.wait_for(_SERVING)
    scheme, http_port = d.wait_for(_HTTP).groups()
    grpc_addr = f"localhost:{serving.group(1)}"
    assert serving.group(2) == "TLS" and scheme == "https"

    trusting = tls.ClientTls(ca_file=pki.ca)
    assert grpc_unhealthy(grpc_addr, 10.0, transport=trusting) is None
    with tls.sync_channel(grpc_addr, trusting) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        assert stub.ListModels(pb.ListModelsRequest(), timeout=10) is not None
    # The SDK, as a client of a TLS door does it.
    with Client(grpc_addr, credentials=tls_credentials(str(pki.ca)), retry=NO_RETRY) as sdk:
        assert sdk.list_models() == ()  # no engine registered: an answer, over TLS
    # Plaintext, and TLS without trusting the CA (the system's roots do not know it), get no answer.
    assert "UNAVAILABLE" in str(grpc_unhealthy(grpc_addr, 5.0))
    assert "UNAVAILABLE" in str(grpc_unhealthy(grpc_addr, 5.0, transport=tls.ClientTls()))

    https = f"https://localhost:{http_port}/health"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(pki.ca)), timeout=10) as client:
        assert client.get(https).status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://localhost:{http_port}/health", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(https, timeout=10)  # verifies against the system's roots

    assert d.stop() == 0


# --- mutual TLS between the dispatcher and the router and predictor ----------------------------------------


def _stage() -> StageRequest:
    return StageRequest(
        request_id="r1",
        program_id="p1",
        stage=0,
        workflow="code",
        messages=(ChatMessage("user", "task 1"),),
        sampling=SamplingParams(max_tokens=16),
    )


async def _score(addr: str, transport: tls.ClientTls | None) -> float:
    async with tls.aio_channel(addr, transport) as channel:
        return (await RouterClient(channel, 10.0).score("task 1", "code", ["m0"]))["m0"]


async def _predict(addr: str, transport: tls.ClientTls | None) -> int:
    async with tls.aio_channel(addr, transport) as channel:
        return (await PredictorClient(channel, 10.0).predict(_stage(), ["m0"]))["m0"].p50


def _mtls_env(svc: str, pki: Pki, artifacts: Path) -> dict[str, str]:
    p = f"CHIMERA_{svc.upper()}_"
    return {
        f"{p}PORT": "0",
        f"{p}METRICS_PORT": "0",
        f"{p}ARTIFACT_DIR": str(artifacts / svc),
        f"{p}TLS_CERT_FILE": str(pki.server.cert),
        f"{p}TLS_KEY_FILE": str(pki.server.key),
        f"{p}TLS_CLIENT_CA_FILE": str(pki.ca),
        f"{p}GRACE_S": "1",
    }


@pytest.mark.e2e
async def test_router_and_predictor_serve_only_clients_with_a_certificate(
    tmp_path: Path, pki: Pki, services: list[Service]
) -> None:
    traces, outcomes = _fake_rows()
    train_router(traces, outcomes, tmp_path, holdout=0.0)
    train_predictor(traces, tmp_path, holdout=0.0)
    router = Service("services.router", _mtls_env("router", pki, tmp_path))
    predictor = Service("services.predictor", _mtls_env("predictor", pki, tmp_path))
    services += [router, predictor]
    addrs = {}
    for name, svc in (("router", router), ("predictor", predictor)):
        m = svc.wait_for(_SERVING)
        assert m.group(2) == "mutual TLS"
        addrs[name] = f"localhost:{m.group(1)}"

    # What the dispatcher builds from its CHIMERA_DISPATCHER_UPSTREAM_TLS_* settings.
    s = DispatcherSettings(
        upstream_tls_ca_file=pki.ca,
        upstream_tls_cert_file=pki.client.cert,
        upstream_tls_key_file=pki.client.key,
    )
    with_cert = tls.client_tls(s.upstream_tls_ca_file, s.upstream_tls_cert_file, s.upstream_tls_key_file)
    assert with_cert is not None
    assert 0.0 < await _score(addrs["router"], with_cert) < 1.0
    assert await _predict(addrs["predictor"], with_cert) >= 1

    refused = {
        "plaintext": None,
        "no client certificate": tls.ClientTls(ca_file=pki.ca),
        "another CA's certificate": tls.ClientTls(pki.ca, pki.rogue_client.cert, pki.rogue_client.key),
    }
    for why, transport in refused.items():
        with pytest.raises(UpstreamError, match="UNAVAILABLE"):
            await _score(addrs["router"], transport)
            pytest.fail(f"router served a client with {why}")
        with pytest.raises(UpstreamError, match="UNAVAILABLE"):
            await _predict(addrs["predictor"], transport)
            pytest.fail(f"predictor served a client with {why}")

    # The container health check reaches a mutual-TLS server with the flags compose would pass.
    flags = ["--ca-file", str(pki.ca), "--cert-file", str(pki.client.cert), "--key-file", str(pki.client.key)]
    assert healthcheck.main(["grpc", addrs["router"], *flags]) == 0
    assert healthcheck.main(["grpc", addrs["predictor"], "--ca-file", str(pki.ca)]) == 1

    assert router.stop() == 0
    assert predictor.stop() == 0
