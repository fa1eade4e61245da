"""What a finished request leaves behind: its result, its trace row and the fields its final event carries.

Pure functions of the claim and the engine's final output, so the worker's loops stay about leases and
admission, and the rows the predictor later trains on are built in one place.
"""

from __future__ import annotations

from services.common.types import ClaimedRequest, StageResult, TraceRow
from services.worker.engine.base import EngineOutput


def stage_result(final: EngineOutput, text: str) -> StageResult:
    return StageResult(text, final.finish_reason or "stop", final.prompt_tokens, final.completion_tokens)


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
