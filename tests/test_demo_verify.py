"""The demo verifies each completed workflow's last answer and sends the score with EndProgram; its table
shows the score. A fake dispatcher stub answers the stages (no services started)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from rich.console import Console

from chimera.dispatcher.v1 import dispatcher_pb2 as pb
from services.demo.client import WorkflowRun, run_workflow
from services.demo.report import print_report, score_summary
from services.verify.answers import AnswerKey
from services.verify.checks import NumericCheck
from services.verify.numeric import parse_reference
from services.workload.corpus import Problem
from services.workload.workflows import get_workflow

pytestmark = pytest.mark.unit


class FakeStub:
    """Answers every stage with ``answer``; records the EndProgram requests."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.ended: list[pb.EndProgramRequest] = []

    async def _stream(self) -> AsyncIterator[pb.GenerateResponse]:
        final = pb.Completion(text=self.answer, model="m", engine="e", usage=pb.Usage(completion_tokens=3))
        yield pb.GenerateResponse(final=final)

    def Generate(self, _req: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:  # noqa: N802
        return self._stream()

    async def EndProgram(self, req: pb.EndProgramRequest) -> pb.EndProgramResponse:  # noqa: N802
        self.ended.append(req)
        return pb.EndProgramResponse()


def _key() -> AnswerKey:
    ref = parse_reference("391")
    assert ref is not None
    return AnswerKey({"t/1": NumericCheck(ref)})


def _run(pid: str, problem_id: str) -> WorkflowRun:
    problem = Problem(
        id=problem_id, text="17 km an hour for 23 hours?", domain="math", difficulty=0.1, source="t"
    )
    return WorkflowRun(pid, get_workflow("math/planner-solver"), problem)


@pytest.mark.parametrize(("answer", "score"), [("Answer: 391", 1.0), ("Answer: 390", 0.0)])
async def test_the_verified_score_goes_back_with_end_program(answer: str, score: float) -> None:
    stub = FakeStub(answer)
    run = await run_workflow(stub, _run("p1", "t/1"), max_tokens=8, key=_key())
    assert run.completed and run.verdict is not None and run.verdict.score == score
    (end,) = stub.ended
    assert end.program_id == "p1" and end.HasField("outcome") and end.outcome == score


async def test_an_unverifiable_problem_ends_without_an_outcome() -> None:
    stub = FakeStub("Answer: 391")
    run = await run_workflow(stub, _run("p2", "t/unknown"), max_tokens=8, key=_key())
    assert run.completed and run.verdict is None
    assert not stub.ended[0].HasField("outcome")


async def test_the_table_shows_the_verified_score() -> None:
    right = await run_workflow(FakeStub("Answer: 391"), _run("p3", "t/1"), 8, _key())
    wrong = await run_workflow(FakeStub("Answer: 12"), _run("p4", "t/1"), 8, _key())
    none = await run_workflow(FakeStub("Answer: 1"), _run("p5", "t/2"), 8, _key())
    console = Console(width=200, record=True)
    assert print_report(console, [right, wrong, none]) == 0
    text = console.export_text()
    assert "score" in text and "answer 12, expected 391" in text
    assert score_summary([right, wrong, none]).endswith("math 0.50 (1/2)")
