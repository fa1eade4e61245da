"""Every fault kind of the fault benchmark on real processes (launcher, private redis-server, router,
predictor, dispatcher, two simulated-engine workers), under a few concurrent SDK workflows: nothing is lost,
no stage's streamed text mixes two attempts or is answered twice, every workflow completes (the SDK's own
retries included), and the accounting drains to zero. ``make bench-faults`` runs the same with more load
and reports the counts; here they are asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faults.inject import FAULTS
from bench.faults.run import run_kinds
from bench.faults.stack import RunConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# Few workflows keep each kind near half a minute; every fault, the engine crash included, strikes once a
# quarter of the stages are answered, among running requests.
CONFIG = RunConfig(workflows=6, fault_latest_s=10.0)


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_a_fault_loses_nothing_and_duplicates_nothing(kind: str, tmp_path: Path) -> None:
    row = run_kinds([kind], CONFIG, tmp_path)[kind]
    c = row["counts"]
    assert row["injection"]["injectable"], row["injection"]
    assert (c["lost"], c["duplicated_stages"], c["traced_twice"]) == (0, 0, 0), c
    # The failures named first: pytest elides the tail of a long dict.
    assert c["completed"] == c["started"] == CONFIG.workflows, (c["failures"], row["log_errors"], c)
    assert row["residue"] == {}, row["residue"]
    assert row["recovery_s"] is not None and row["recovery_s"] < 30, row["recovery_s"]
