"""Several engines serving one model, on real processes: the router scores the model once, and the engine
choice spreads that model's work over its engines (the least loaded first), each workflow staying on one."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from dispatcher_fakes import simulated_stack

from services.sdk.client import AsyncClient
from services.sdk.retry import NO_RETRY
from services.sdk.types import Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SMALL = "Qwen/Qwen2.5-1.5B-Instruct"


async def test_two_engines_of_one_model_share_its_load(tmp_path: Path) -> None:
    with simulated_stack(tmp_path, small_engines=2) as stack:
        async with AsyncClient(stack.dispatcher_addr, retry=NO_RETRY) as client:
            models = {m.name: sorted(e.engine_id for e in m.engines) for m in await client.list_models()}
            assert models[SMALL] == ["small", "small2"]

            async def workflow(i: int) -> list[str]:
                engines = []
                for stage in range(2):
                    done = await client.generate(
                        f"task {i}, step {stage}",
                        program_id=f"multi-{i}",
                        stage=stage,
                        workflow="wf",
                        model=SMALL,
                        sampling=Sampling(max_tokens=32),
                    )
                    engines.append(done.engine)
                await client.end_program(f"multi-{i}")
                return engines

            runs = await asyncio.gather(*(workflow(i) for i in range(12)))
    assert all(len(set(r)) == 1 for r in runs), runs  # each workflow stays on its engine
    spread = Counter(r[0] for r in runs)
    assert set(spread) == {"small", "small2"}, spread  # the model's work went to both of its engines
    assert min(spread.values()) >= 3, spread
