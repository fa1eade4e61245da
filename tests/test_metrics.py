"""Prometheus metrics: recorders and collectors as units, then every service's ``/metrics`` scraped after a
run through the launcher (completed, failed, cancelled and refused requests), where the counts must add up."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import grpc
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import ConnectionError as RedisConnectionError

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from chimera.dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from services.common.artifacts import ArtifactMeta
from services.common.batching import BatchStat
from services.common.jobruns import JobRunsCollector
from services.common.keys import Keys
from services.common.metrics import ModelServiceMetrics, confidence_bucket, start_exporter
from services.common.types import ChatMessage, Prediction, SamplingParams, StageRequest
from services.demo.client import WorkflowRun, plan_runs, run_stage
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.handoff import Dispatched, Final
from services.dispatcher.metrics import DispatcherMetrics, EngineCollector
from services.launcher.config import LauncherSettings
from services.launcher.pool import EngineSpec, PoolSpec
from services.launcher.stack import Stack, running_stack
from services.predictor.config import PredictorSettings
from services.router.config import RouterSettings
from services.worker.config import WorkerSettings
from services.worker.metrics import WorkerMetrics
from services.workload.corpus import embedded_corpus

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Exposition text -> {(sample name, sorted labels): value}."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of every sample called ``name`` whose labels include ``match``."""
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and set(match.items()) <= set(dict(labels).items())
    )


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    v = registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


# --- units ------------------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("q", "bucket"), [(0.0, "0.1"), (0.1, "0.1"), (0.1001, "0.2"), (0.55, "0.6"), (1.0, "1.0"), (1.7, "1.0")]
)
def test_confidence_bucket_is_the_deciles_upper_edge(q: float, bucket: str) -> None:
    assert confidence_bucket(q) == bucket


@pytest.mark.unit
def test_model_service_metrics_calls_batches_and_artifact_version() -> None:
    reg = CollectorRegistry()
    m = ModelServiceMetrics(reg, "router")
    m.observe_call("Score", "OK", 0.002)
    m.observe_call("Score", "UNAVAILABLE", 0.001)
    m.on_batch(BatchStat(size=5, requests=3, latency_s=0.01, version="v1", ok=True))
    m.on_reload(ArtifactMeta("v1", "router", "prior", "now", "h", 10, ("a",)))
    m.on_reload(ArtifactMeta("v2", "router", "tfidf", "now", "h", 10, ("a",)))
    assert value(reg, "chimera_router_call_seconds_count", method="Score", code="OK") == 1
    assert value(reg, "chimera_router_errors_total", method="Score", code="UNAVAILABLE") == 1
    assert value(reg, "chimera_router_errors_total", method="Score", code="OK") == 0
    assert value(reg, "chimera_router_batch_size_sum") == 5
    assert value(reg, "chimera_router_batch_requests_sum") == 3
    assert value(reg, "chimera_router_batch_seconds_count", ok="true") == 1
    # Only the version being served has a series.
    assert value(reg, "chimera_router_artifact_info", version="v1", backend="prior") == 0
    assert value(reg, "chimera_router_artifact_info", version="v2", backend="tfidf") == 1
    assert value(reg, "chimera_router_artifact_loads_total") == 2


@pytest.mark.unit
def test_exporter_serves_its_own_registry_on_a_free_port() -> None:
    reg = CollectorRegistry()
    ModelServiceMetrics(reg, "predictor").observe_call("Predict", "OK", 0.01)
    exporter = start_exporter(reg, "127.0.0.1", 0)
    assert exporter is not None and exporter.port > 0
    try:
        text = urllib.request.urlopen(f"http://{exporter.addr}/metrics", timeout=5).read().decode()
        assert total(parse(text), "chimera_predictor_call_seconds_count", method="Predict") == 1
        # A second exporter on a taken port does not raise: the service keeps serving without /metrics.
        assert start_exporter(CollectorRegistry(), "127.0.0.1", exporter.port) is None
    finally:
        exporter.stop()


def _dispatched(program: str, engine: str = "e0", model: str = "m", p50: int = 100) -> Dispatched:
    req = StageRequest(
        request_id=uuid.uuid4().hex,
        program_id=program,
        stage=0,
        workflow="code",
        messages=(ChatMessage("user", "hi"),),
        sampling=SamplingParams(max_tokens=256),
        received_unix=1000.0,
    )
    return Dispatched(req, engine, model, Prediction(p50, p50 * 2), 0.0, 1000.5, 12.0, ("predictor",))


def _final(d: Dispatched, tokens: int, reason: str = "stop", wait: float = 2.0) -> Final:
    return Final(
        d.request.request_id, "x", reason, 3, tokens, d.model, d.engine, wait, 5.0, 100, 200, 1, 12.0
    )


@pytest.mark.unit
def test_dispatcher_metrics_account_for_every_dispatched_request() -> None:
    reg = CollectorRegistry()
    m = DispatcherMetrics(reg)
    done, cancelled_late, failed, gone = (_dispatched(f"p{i}") for i in range(4))
    for d in (done, cancelled_late, failed, gone):
        m.accepted(d, "new", {"m": 0.72})
    m.finished(done, _final(done, 40))
    m.finished(cancelled_late, _final(cancelled_late, 0, reason="cancelled"))
    m.failed_with(failed, "DEADLINE_EXCEEDED")
    m.abandoned(gone)
    m.refused("NOT_FOUND")
    em = {"engine": "e0", "model": "m"}
    assert value(reg, "chimera_dispatcher_requests_dispatched_total", **em) == 4
    assert value(reg, "chimera_dispatcher_requests_completed_total", **em) == 1
    assert value(reg, "chimera_dispatcher_requests_cancelled_total", **em) == 2
    assert value(reg, "chimera_dispatcher_requests_failed_total", **em, code="DEADLINE_EXCEEDED") == 1
    assert value(reg, "chimera_dispatcher_errors_total", code="DEADLINE_EXCEEDED", phase="stream") == 1
    assert value(reg, "chimera_dispatcher_errors_total", code="NOT_FOUND", phase="dispatch") == 1
    assert value(reg, "chimera_dispatcher_degraded_total", dependency="predictor") == 4
    assert value(reg, "chimera_dispatcher_dispatch_seconds_sum", branch="new") == pytest.approx(0.048)
    # Queue wait is claim - enqueue; age at dispatch adds the time before the enqueue (0.5 s here).
    assert value(reg, "chimera_dispatcher_queue_wait_seconds_sum", **em) == pytest.approx(2.0)
    assert value(reg, "chimera_dispatcher_age_at_dispatch_seconds_sum", **em) == pytest.approx(2.5)
    assert value(reg, "chimera_dispatcher_router_confidence_count", model="m") == 4


@pytest.mark.unit
def test_realized_tokens_cover_the_rest_of_the_program_and_calibration_buckets_outcomes() -> None:
    reg = CollectorRegistry()
    m = DispatcherMetrics(reg)
    s0, s1 = _dispatched("p", p50=100), _dispatched("p", p50=30)
    m.finished(s0, _final(s0, 60))
    m.finished(s1, _final(s1, 40))
    program = {"model": "m", "confidences": json.dumps({"m": 0.85, "other": 0.2})}
    m.program_ended("p", program, 1.0)
    # Stage 0 predicted the whole program (100 vs 60 + 40 = 100); stage 1 only itself (30 vs 40).
    assert value(reg, "chimera_dispatcher_realized_tokens_sum", model="m") == 140
    assert value(reg, "chimera_dispatcher_realized_over_predicted_sum", model="m") == pytest.approx(
        1 + 40 / 30
    )
    assert value(reg, "chimera_dispatcher_calibration_programs_total", model="m", confidence="0.9") == 1
    assert value(reg, "chimera_dispatcher_calibration_outcome_total", model="m", confidence="0.9") == 1
    m.program_ended("q", {"model": "m", "confidences": "{}"}, 0.0)  # pinned: nothing to calibrate
    assert total(parse_registry(reg), "chimera_dispatcher_calibration_programs_total") == 1


@pytest.mark.unit
def test_open_programs_are_bounded() -> None:
    reg = CollectorRegistry()
    m = DispatcherMetrics(reg, max_open_programs=2)
    for p in ("a", "b", "c"):
        d = _dispatched(p)
        m.finished(d, _final(d, 10))
    m.program_ended("a", {}, None)  # evicted: observed nowhere
    m.program_ended("c", {}, None)
    assert value(reg, "chimera_dispatcher_realized_tokens_count", model="m") == 1


def parse_registry(reg: CollectorRegistry) -> Samples:
    return parse(generate_latest(reg).decode())


@pytest.mark.unit
def test_engine_collector_reads_queue_gauges_at_scrape_time() -> None:
    r = fakeredis.FakeRedis(decode_responses=True)
    k = Keys(f"t{uuid.uuid4().hex[:6]}")
    now = time.time()
    r.sadd(k.engines(), "e0", "e1")
    r.hset(
        k.engine_info("e0"),
        mapping={
            "model": "m0",
            "decode_ms_per_token": 30,
            "max_num_seqs": 4,
            "heartbeat_ms": now * 1000,
            "load": 250,
        },
    )
    r.hset(k.engine_info("e1"), mapping={"model": "m1"})  # no profile: reported, but dead
    r.zadd(k.queue("e0"), {"a": 1.0, "b": 2.0})
    r.hset(k.request("e0", "a"), "t_enq", now - 7.0)
    r.hset(k.request("e0", "b"), "t_enq", now - 30.0)  # worse placed, waiting longer
    r.zadd(k.claims("e0"), {"c": now * 1000})
    reg = CollectorRegistry()
    reg.register(EngineCollector(r, k, dead_after_s=15.0, clock=lambda: now))
    assert value(reg, "chimera_engine_queue_depth", engine="e0", model="m0") == 2
    assert value(reg, "chimera_engine_running", engine="e0", model="m0") == 1
    assert value(reg, "chimera_engine_inflight_predicted_tokens", engine="e0", model="m0") == 250
    assert value(reg, "chimera_engine_alive", engine="e0", model="m0") == 1
    assert value(reg, "chimera_engine_alive", engine="e1", model="m1") == 0
    assert value(reg, "chimera_engine_oldest_queued_age_seconds", engine="e0", model="m0") == 30.0
    assert value(reg, "chimera_engine_oldest_queued_age_seconds", engine="e1", model="m1") == 0.0
    assert value(reg, "chimera_dispatcher_redis_up") == 1
    r.zrem(k.queue("e0"), "a", "b")
    assert value(reg, "chimera_engine_queue_depth", engine="e0", model="m0") == 0, "read fresh per scrape"
    assert value(reg, "chimera_engine_oldest_queued_age_seconds", engine="e0", model="m0") == 0.0


@pytest.mark.unit
def test_engine_collector_reports_an_unreachable_redis_instead_of_failing_the_scrape() -> None:
    class FakeDownRedis:
        def smembers(self, key: str) -> Any:
            raise RedisConnectionError("down")

    reg = CollectorRegistry()
    reg.register(EngineCollector(FakeDownRedis(), Keys("x"), 15.0))  # type: ignore[arg-type]
    assert value(reg, "chimera_dispatcher_redis_up") == 0
    assert reg.get_sample_value("chimera_engine_queue_depth", {"engine": "e0", "model": "m"}) is None


@pytest.mark.unit
def test_worker_metrics() -> None:
    reg = CollectorRegistry()
    m = WorkerMetrics(reg, "e0", "m")
    m.claimed(3)
    m.occupancy(running=2, held=3)
    m.completed("stop", 1.5, 42)
    m.ended("lost")
    m.engine_error("request")
    m.lease_lost()
    m.requeued(2)
    em = {"engine": "e0", "model": "m"}
    assert value(reg, "chimera_worker_claims_total", **em) == 3
    assert value(reg, "chimera_worker_running_sequences", **em) == 2
    assert value(reg, "chimera_worker_held_claims", **em) == 3
    assert value(reg, "chimera_worker_requests_total", **em, outcome="stop") == 1
    assert value(reg, "chimera_worker_requests_total", **em, outcome="lost") == 1
    assert value(reg, "chimera_worker_stage_run_seconds_sum", **em) == 1.5
    assert value(reg, "chimera_worker_tokens_generated_total", **em) == 42
    assert value(reg, "chimera_worker_engine_errors_total", **em, kind="request") == 1
    assert value(reg, "chimera_worker_lease_losses_total", **em) == 1
    assert value(reg, "chimera_worker_reaper_requeued_total", **em) == 2


# --- end to end through the launcher -------------------------------------------------------------------

PROFILE = {
    "decode_ms_per_token": 33.0,
    "max_batch_size": 4,
    "prefill_ms_per_token": 0.0,
    "step_ms": [[1, 33.0]],
}


def _engine(eid: str, model: str) -> EngineSpec:
    return EngineSpec(
        id=eid,
        model=model,
        kind="simulated",
        max_num_seqs=4,
        env={"time_scale": "10", "lease_s": "2", "profile_json": json.dumps(PROFILE)},
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    pool = PoolSpec(
        engines=(_engine("small", "Qwen/Qwen2.5-1.5B-Instruct"), _engine("large", "Qwen/Qwen2.5-7B-Instruct"))
    )
    settings = LauncherSettings.ephemeral(tmp_path)
    with running_stack(settings, pool) as s:
        yield s


def scrape(addr: str) -> Samples:
    return parse(urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode())


def _long_request(program: str, timeout_ms: int = 0) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        program_id=program,
        workflow="code",
        messages=[pb.ChatMessage(role="user", content="write a long program")],
        sampling=pb.SamplingParams(max_tokens=2000),
        timeout_ms=timeout_ms,
    )


async def _drive(stack: Stack) -> tuple[int, int]:
    """Six workflows ended with outcomes, one cancelled and one failed request, one refused.

    Returns (stages completed, programs ended with an outcome).
    """
    runs = plan_runs(embedded_corpus().problems, 6, seed=3)
    async with grpc.aio.insecure_channel(stack.dispatcher_addr) as ch:
        stub = pb_grpc.DispatcherStub(ch)

        async def workflow(i: int, run: WorkflowRun) -> int:
            history: list[str] = []
            for stage in range(run.workflow.n_stages):
                out = await run_stage(stub, run, stage, history, max_tokens=24)
                history.append(out.text)
            await stub.EndProgram(pb.EndProgramRequest(program_id=run.program_id, outcome=float(i % 2)))
            return run.workflow.n_stages

        async def cancelled() -> None:
            call = stub.Generate(_long_request("met-cancel"))
            async for resp in call:
                if resp.HasField("delta"):
                    break
            call.cancel()
            await stub.EndProgram(pb.EndProgramRequest(program_id="met-cancel"))

        async def failed() -> None:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Generate(_long_request("met-fail", timeout_ms=40)):
                    pass
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await stub.EndProgram(pb.EndProgramRequest(program_id="met-fail"))

        async def refused() -> None:
            req = _long_request("met-refused")
            req.model = "no-such-model"
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Generate(req):
                    pass
            assert info.value.code() == grpc.StatusCode.NOT_FOUND

        stages = await asyncio.wait_for(
            asyncio.gather(*(workflow(i, r) for i, r in enumerate(runs)), cancelled(), failed(), refused()),
            120,
        )
    return sum(s for s in stages if s), len(runs)


def _settled(d: Samples) -> bool:
    ends = sum(
        total(d, f"chimera_dispatcher_requests_{k}_total") for k in ("completed", "failed", "cancelled")
    )
    busy = sum(total(d, n) for n in ("chimera_engine_queue_depth", "chimera_engine_running"))
    return ends == total(d, "chimera_dispatcher_requests_dispatched_total") and busy == 0


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_every_service_exposes_metrics_that_add_up_after_a_run(stack: Stack) -> None:
    assert set(stack.metrics) == {"router", "predictor", "dispatcher", "worker-small", "worker-large"}
    n_stages, n_programs = asyncio.run(_drive(stack))

    deadline = time.monotonic() + 30  # the cancelled request ends once its worker sees the flag
    d = scrape(stack.metrics["dispatcher"])
    while not _settled(d) and time.monotonic() < deadline:
        time.sleep(0.2)
        d = scrape(stack.metrics["dispatcher"])

    dispatched = total(d, "chimera_dispatcher_requests_dispatched_total")
    completed = total(d, "chimera_dispatcher_requests_completed_total")
    failed = total(d, "chimera_dispatcher_requests_failed_total")
    cancelled = total(d, "chimera_dispatcher_requests_cancelled_total")
    assert (dispatched, completed, failed, cancelled) == (n_stages + 2, n_stages, 1, 1)
    for e in stack.pool.engines:  # the identity holds per engine and model too
        em = {"engine": e.id, "model": e.model}
        ends = sum(
            total(d, f"chimera_dispatcher_requests_{k}_total", **em)
            for k in ("completed", "failed", "cancelled")
        )
        assert total(d, "chimera_dispatcher_requests_dispatched_total", **em) == ends
        assert total(d, "chimera_engine_queue_depth", **em) == 0
        assert total(d, "chimera_engine_running", **em) == 0
        assert total(d, "chimera_engine_inflight_predicted_tokens", **em) == 0
        assert total(d, "chimera_engine_oldest_queued_age_seconds", **em) == 0
        assert total(d, "chimera_engine_alive", **em) == 1
    assert total(d, "chimera_dispatcher_requests_failed_total", code="DEADLINE_EXCEEDED") == 1
    assert total(d, "chimera_dispatcher_errors_total", code="DEADLINE_EXCEEDED", phase="stream") == 1
    assert total(d, "chimera_dispatcher_errors_total", code="NOT_FOUND", phase="dispatch") == 1
    assert total(d, "chimera_dispatcher_dispatch_seconds_count") == dispatched
    assert total(d, "chimera_dispatcher_queue_wait_seconds_count") == completed
    assert total(d, "chimera_dispatcher_age_at_dispatch_seconds_count") == completed
    # Every new program (the six, the cancelled one, the failed one) asked the router once; a slow router
    # degrades the dispatch, which then has no confidence to record.
    new_programs = n_programs + 2
    routed = new_programs - total(d, "chimera_dispatcher_degraded_total", dependency="router")
    assert total(d, "chimera_dispatcher_upstream_seconds_count", dependency="router") == new_programs
    assert total(d, "chimera_dispatcher_upstream_seconds_count", dependency="predictor") >= n_stages
    assert total(d, "chimera_dispatcher_router_confidence_count") == routed > 0
    assert total(d, "chimera_dispatcher_predicted_tokens_count") == dispatched
    assert total(d, "chimera_dispatcher_realized_over_predicted_count") == n_stages
    assert 0 < total(d, "chimera_dispatcher_calibration_programs_total") <= n_programs
    if routed == new_programs:
        assert total(d, "chimera_dispatcher_calibration_programs_total") == n_programs
        assert total(d, "chimera_dispatcher_calibration_outcome_total") == n_programs // 2

    workers = [scrape(stack.metrics[f"worker-{e.id}"]) for e in stack.pool.engines]
    assert sum(total(w, "chimera_worker_claims_total") for w in workers) >= n_stages + 1
    assert sum(total(w, "chimera_worker_tokens_generated_total") for w in workers) > 0
    assert sum(total(w, "chimera_worker_stage_run_seconds_count") for w in workers) >= n_stages
    assert sum(total(w, "chimera_worker_running_sequences") for w in workers) == 0

    for svc, method in (("router", "Score"), ("predictor", "Predict")):
        m = scrape(stack.metrics[svc])
        assert total(m, f"chimera_{svc}_call_seconds_count", method=method, code="OK") > 0, svc
        assert total(m, f"chimera_{svc}_batch_size_count") > 0, svc
        assert total(m, f"chimera_{svc}_batch_seconds_count", ok="true") > 0, svc
        assert total(m, f"chimera_{svc}_artifact_info") == 1, svc


# --- deploy files agree with the code -------------------------------------------------------------------

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def _exposed_names() -> set[str]:
    reg = CollectorRegistry()
    ModelServiceMetrics(reg, "router")
    ModelServiceMetrics(reg, "predictor")
    DispatcherMetrics(reg)
    WorkerMetrics(reg, "e0", "m")
    reg.register(EngineCollector(fakeredis.FakeRedis(decode_responses=True), Keys("x"), 15.0))
    reg.register(JobRunsCollector(fakeredis.FakeRedis(decode_responses=True), Keys("x")))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {fam.name + s for fam in reg.collect() for s in suffixes.get(fam.type, ("",))}


@pytest.mark.unit
def test_dashboard_queries_only_series_the_services_expose() -> None:
    dash = json.loads((DEPLOY / "grafana" / "chimera-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {n for e in exprs for n in re.findall(r"\bchimera_[a-z_]+", e)}
    assert len(used) >= 30
    assert used - _exposed_names() == set()
    datasource = (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    uids = {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    assert uids == {"chimera-prometheus"} and "uid: chimera-prometheus" in datasource


@pytest.mark.unit
def test_prometheus_scrapes_every_service_on_its_default_metrics_port() -> None:
    conf = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in conf["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    for host, cls in (
        ("dispatcher", DispatcherSettings),
        ("router", RouterSettings),
        ("predictor", PredictorSettings),
        ("worker-0", WorkerSettings),
        ("worker-1", WorkerSettings),
    ):
        assert f"{host}:{cls.model_fields['metrics_port'].default}" in targets
