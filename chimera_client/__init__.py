"""Python SDK for Chimera's gRPC front door: sync and async clients and a ``Workflow`` helper.

async with AsyncClient("127.0.0.1:50051") as client:
    async with client.workflow("code/planner-coder") as wf:
        plan = await wf.run_stage([("system", "You plan."), ("user", task)])
        code = await wf.run_stage([("user", task), ("assistant", plan.text), ("user", "Write it.")])
        wf.set_outcome(1.0 if tests_pass(code.text) else 0.0)
"""

from chimera_client.client import AsyncClient, Client, tls_credentials
from chimera_client.errors import (
    ChimeraError,
    DeadlineExceededError,
    DuplicateRequestError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    RequestCancelledError,
    RequestTooLargeError,
    StageConflictError,
    UnavailableError,
)
from chimera_client.retry import NO_RETRY, RetryPolicy
from chimera_client.types import (
    Completion,
    DispatchTimings,
    EngineStatus,
    Message,
    MessageLike,
    ModelStatus,
    ProgramEnd,
    ResponseFormat,
    Sampling,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    Tools,
)
from chimera_client.workflow import AsyncWorkflow, Workflow

__all__ = [
    "AsyncClient",
    "tls_credentials",
    "NO_RETRY",
    "RetryPolicy",
    "AsyncWorkflow",
    "ChimeraError",
    "Client",
    "Completion",
    "DeadlineExceededError",
    "DispatchTimings",
    "DuplicateRequestError",
    "EngineStatus",
    "InvalidRequestError",
    "Message",
    "MessageLike",
    "ModelNotFoundError",
    "ModelStatus",
    "ProgramEnd",
    "RequestCancelledError",
    "OverloadedError",
    "RequestTooLargeError",
    "ResponseFormat",
    "Sampling",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "Tools",
    "StageConflictError",
    "TextDelta",
    "UnavailableError",
    "Workflow",
]
