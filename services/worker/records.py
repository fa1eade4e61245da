"""What a finished request leaves behind: its result, its trace row and the fields its final event carries.

Pure functions of the claim and the engine's final output, so the worker's loops stay about leases and
admission, and the rows the predictor later trains on are built in one place.
"""

from __future__ import annotations

from typing import Any

from services.common.types import ClaimedRequest, StageResult, TraceRow
from services.worker.engine.base import EngineOutput


def stage_result(final: EngineOutput, text: str) -> StageResult:
    reason = final.finish_reason or "stop"
    if final.tool_calls and reason == "stop":
        reason = "tool_calls"  # as OpenAI reports an answer that ends in calls
    return StageResult(
        text, reason, final.prompt_tokens, final.completion_tokens, final.tool_calls, final.cached_tokens
    )


def tool_extra(c: ClaimedRequest, result: StageResult) -> dict[str, Any]:
    """What a trace row records of a stage's tools, for the predictor and the router to learn from: how
    many it was offered, how many calls it made and to which functions, and whether it answers a call."""
    use = c.request.tool_use
    if use is None and not result.tool_calls and not any(m.role == "tool" for m in c.request.messages):
        return {}
    return {
        "tools_offered": len(use.tools) if use else 0,
        "tool_choice": use.choice if use else "none",
        "tool_calls": len(result.tool_calls),
        "tool_names": [t.name for t in result.tool_calls],
        "tool_results_in": sum(m.role == "tool" for m in c.request.messages),
    }


def trace_row(
    c: ClaimedRequest, result: StageResult, engine_id: str, model: str, run_s: float
) -> TraceRow | None:
    """The predictor's training row, or None for a cancelled stage: its token count is truncated, and as a
    training row it would teach the predictor lengths that never happen."""
    if result.finish_reason == "cancelled":
        return None
    req = c.request
    return TraceRow(
        request_id=req.request_id,
        program_id=req.program_id,
        workflow=req.workflow,
        stage=req.stage,
        engine=engine_id,
        model=model,
        system_text=req.system_text(),
        user_text=req.user_text(),
        prompt_text=req.prompt_text(),
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        predicted=c.predicted,
        predicted_p90=c.predicted_p90,
        queue_wait_s=c.queue_wait_s,
        run_s=run_s,
        finish_reason=result.finish_reason,
        attempt=c.attempt,
        enqueued_unix=c.enqueued_unix,
        # The prefix-cache hit of this stage: after a tool pause, what staying on its engine saved.
        extra={**tool_extra(c, result), "cached_prompt_tokens": result.cached_tokens},
    )


def final_extra(c: ClaimedRequest, engine_id: str, model: str, run_s: float) -> dict[str, str | int | float]:
    """The worker's side of the final event: where and how long the stage ran, and what it was predicted."""
    return {
        "model": model,
        "engine": engine_id,
        "queue_wait_s": round(c.queue_wait_s, 6),
        "run_s": round(run_s, 6),
        "predicted": c.predicted,
        "predicted_p90": c.predicted_p90,
        "attempt": c.attempt,
    }
