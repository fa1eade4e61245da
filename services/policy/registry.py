"""Every policy by name: Chimera, the improved rule and the paper's baselines (§8).

Read-only on purpose: policies are chosen by name in config, never patched at run time. What each one
decides, its parameters and what it is fed are in this package's README.md (one section per policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from services.policy.aging import fcfs_priority, priority_score
from services.policy.chimera import select_engine
from services.policy.chimera_plus import plus_select
from services.policy.contract import Policy, PriorityInput
from services.policy.mlfq import mlfq_priority
from services.policy.vllm import vllm_select

POLICIES: Mapping[str, Policy] = MappingProxyType(
    {
        "chimera": Policy("chimera", select_engine, priority_score, PriorityInput.PREDICTED_TOTAL),
        "chimera-plus": Policy("chimera-plus", plus_select, priority_score, PriorityInput.PREDICTED_TOTAL),
        "vllm": Policy("vllm", vllm_select, fcfs_priority, PriorityInput.ARRIVAL),
        "vllm-stjf": Policy("vllm-stjf", vllm_select, priority_score, PriorityInput.ORACLE_TOTAL),
        "ltr": Policy("ltr", vllm_select, priority_score, PriorityInput.PER_STAGE),
        "mlfq": Policy("mlfq", vllm_select, mlfq_priority, PriorityInput.ATTAINED),
    },
)
