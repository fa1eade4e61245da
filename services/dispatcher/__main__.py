"""``python -m services.dispatcher``: wiring only."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from services.common import loop as event_loop
from services.common import tls
from services.common.keys import Keys
from services.common.logs import setup_logging
from services.common.queue import QueueStore
from services.common.queue_records import Retention
from services.common.redis_client import connect, connect_reader
from services.dispatcher.clients import ConfidenceSource, LengthSource
from services.dispatcher.coalesce import sources
from services.dispatcher.config import DispatcherSettings
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.http_api import build_http_server
from services.dispatcher.hub import StreamHub
from services.dispatcher.inline import inline_sources
from services.dispatcher.metrics import DispatcherMetrics, metrics_endpoint
from services.dispatcher.server import DispatcherServer, run
from services.predictor.config import PredictorSettings
from services.router.config import RouterSettings


@contextlib.asynccontextmanager
async def _models(
    s: DispatcherSettings, metrics: DispatcherMetrics
) -> AsyncIterator[tuple[ConfidenceSource, LengthSource]]:
    """The router and predictor as the settings place them: in this process, or behind their services."""
    if s.inference == "inline":
        timeouts = (s.router_timeout_s, s.predictor_timeout_s)
        models = RouterSettings(), PredictorSettings()
        async with inline_sources(*models, timeouts, metrics.registry) as both:
            yield both
        return
    upstream = tls.client_tls(
        s.upstream_tls_ca_file, s.upstream_tls_cert_file, s.upstream_tls_key_file, s.upstream_tls_server_name
    )
    async with (
        tls.aio_channel(s.router_addr, upstream) as rc,
        tls.aio_channel(s.predictor_addr, upstream) as pc,
    ):
        yield sources(rc, pc, s)


async def _main(s: DispatcherSettings, metrics: DispatcherMetrics) -> None:
    redis = connect(s.redis_url, s.redis_max_connections, s.redis_outage_s)
    # The stream hub's one blocking read gets a connection of its own, never one of the pool's.
    reader = connect_reader(s.redis_url, s.redis_outage_s)
    async with _models(s, metrics) as (router, predictor):
        store = QueueStore(redis, Keys(s.key_prefix), Retention(queue_ttl_s=s.max_queue_wait_s))
        hub = StreamHub(store, reader, s.stream_block_ms)
        dispatcher = Dispatcher(store, redis, router, predictor, s, metrics=metrics, hub=hub)
        try:
            await run(DispatcherServer(dispatcher, redis), build_http_server(dispatcher))
        finally:
            await redis.aclose()
            await reader.aclose()


def main() -> None:
    settings = DispatcherSettings()
    setup_logging("dispatcher", settings.log_level)
    with metrics_endpoint(settings) as metrics:
        event_loop.run(_main(settings, metrics), settings.event_loop)


if __name__ == "__main__":
    main()
