"""The paper's six workflows and the messages of each stage."""

from __future__ import annotations

import pytest

from services.common.tokens import approx_tokens
from services.common.types import ChatMessage, SamplingParams, StageRequest
from services.workload.workflows import (
    WORKFLOWS,
    UnknownWorkflow,
    approx_prompt_tokens,
    get_workflow,
    stage_messages,
    workflows_for,
)


@pytest.mark.unit
def test_six_workflows_with_the_papers_role_sequences() -> None:
    roles = {wf.name: tuple(r.name for r in wf.roles) for wf in WORKFLOWS}
    assert roles == {
        "code/planner-coder-qa-coder": ("planner", "coder", "qa", "coder"),
        "code/planner-coder": ("planner", "coder"),
        "code/coder": ("coder",),
        "math/planner-solver-verifier-solver": ("planner", "solver", "verifier", "solver"),
        "math/planner-solver": ("planner", "solver"),
        "math/solver": ("solver",),
    }
    assert [w.n_stages for w in workflows_for("math")] == [4, 2, 1]
    assert get_workflow("code/coder").domain == "code"
    with pytest.raises(UnknownWorkflow):
        get_workflow("code/nope")


@pytest.mark.unit
def test_first_stage_is_system_prompt_then_task() -> None:
    wf = get_workflow("math/planner-solver-verifier-solver")
    msgs = stage_messages(wf, 0, "What is 2 + 2?")
    assert [m.role for m in msgs] == ["system", "user"]
    assert msgs[0].content == wf.roles[0].system_prompt
    assert msgs[1].content == "What is 2 + 2?"


@pytest.mark.unit
def test_later_stages_carry_the_role_prompt_task_and_every_earlier_output_in_order() -> None:
    wf = get_workflow("code/planner-coder-qa-coder")
    history = ["PLAN-TEXT", "CODE-TEXT", "REVIEW-TEXT"]
    msgs = stage_messages(wf, 3, "Sort a list.", history)
    assert [m.role for m in msgs] == ["system", "user", "user"]
    assert msgs[0].content == wf.roles[3].system_prompt  # the second coder's prompt, not the QA agent's
    assert msgs[1].content == "Sort a list."
    body = msgs[2].content
    assert body.index("PLAN-TEXT") < body.index("CODE-TEXT") < body.index("REVIEW-TEXT")
    assert "(planner)" in body and "(qa)" in body and "Your turn (coder)" in body
    # What a StageRequest built from these messages exposes to the router and predictor.
    req = StageRequest("r", "p", 3, wf.name, msgs, SamplingParams())
    assert req.user_text() == "Sort a list."
    assert "REVIEW-TEXT" in req.prompt_text()


@pytest.mark.unit
def test_stage_and_history_must_agree() -> None:
    wf = get_workflow("code/planner-coder")
    with pytest.raises(ValueError):
        stage_messages(wf, 2, "t", ["a", "b"])
    with pytest.raises(ValueError):
        stage_messages(wf, 1, "t", [])


@pytest.mark.unit
def test_prompt_token_proxy_counts_texts_plus_framing() -> None:
    msgs = (ChatMessage("system", "one two three"), ChatMessage("user", "four"))
    assert approx_prompt_tokens(msgs) == approx_tokens("one two three") + approx_tokens("four") + 2 * 4 + 3
