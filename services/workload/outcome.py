"""The outcome and length model: a seeded measuring instrument standing in for the paper's models.

Outcome model (README section)
------------------------------

None of Qwen2.5-{1.5B,3B,7B,14B}-Instruct, Llama-3.2-3B-Instruct or Ministral-3-8B can run here. For every
(problem, workflow, model, seed) this module gives what a run of that model would have produced: output tokens
of each stage, a success label and a task score. It is an *instrument*, not a model of any real output: it is
calibrated to the paper's published statistics (``models.py`` lists every target and its source) and driven by
real features of each prompt, so that a router and a length predictor trained on its traces face a task with
the paper's shape. Its coefficients were set from the stated reasoning below, never tuned to make prediction
easier.

Per run it also exposes the *ceiling* a learner can reach: the model's own success probability on that problem
and workflow, and the conditional median / p90 of the remaining output tokens at each stage. Stage lengths are
independent given the problem, so earlier outputs carry no information beyond these.

Features of a problem ``p`` (all real): domain; difficulty ``d`` in [0, 1] (``corpus.py``); prompt length
``l = ln(approx tokens of the text)``. Both are centred per domain on the corpus the model is calibrated on:
``d' = d - mean d``, ``l' = clip(l - median l, +-1.5)``. Hidden factors, fixed per problem (or per problem
and model) by a hash of the ids and the world seed, stand for everything the text does not reveal.

Lengths. Stage j of workflow w emits ``S[m, D] * ROLE_WEIGHT[w, j] * exp(f) * e_j`` tokens, with
``f = LEN_DIFFICULTY[D] * d' + LEN_PROMPT * l' + LEN_HIDDEN_SHARED * u + LEN_HIDDEN_MODEL * v`` and ``e_j``
lognormal with mean 1 and log-sd ``sigma[m, D]``. With probability ``pi[m, D] * exp(RUNAWAY_DIFFICULTY * d')``
a stage instead *runs away* (a repetition loop, the source of the small models' huge stds) and emits
``MAX_GEN_TOKENS * U(0.5, 1.25)`` capped at ``MAX_GEN_TOKENS`` (finish reason "length" at the cap). Per
(model, domain), ``S`` is solved so that the total workflow tokens over the corpus and a uniform workflow mix
have the target mean, then ``sigma`` (within ``STAGE_SIGMA_RANGE``) and, only if the widest spread is not
enough, ``pi`` so that they have the target std. The solve uses the exact first two moments of that mixture
(no sampling noise in the calibration).

Success. ``p = sigmoid(theta[m, D] + WORKFLOW_LOGIT[w] - SUCC_DIFFICULTY[D] * d' - SUCC_PROMPT * l' -
SUCC_HIDDEN_SHARED * a + SUCC_HIDDEN_MODEL * b)`` with ``a`` shared by all models (hard problems are hard for
everyone) and ``b`` per model (what one model happens to know). ``theta`` is solved so that the mean expected
score over the corpus and the workflow mix equals the target score. Code (APPS scores the share of hidden
tests passed) earns 1.0 on success and, with probability ``PARTIAL_CREDIT_RATE``, U(0.05, 0.45) partial
credit on a failure; math (exact match) earns 1 or 0. Partial credit stays below 0.5, so ``score >= 0.5`` is
exactly the success label (what the router trains on).

Constants, each an assumption [A] reasoned as stated (the paper gives none of them):

- ``MAX_GEN_TOKENS = 30000``: Qwen2.5's 32k window less a typical prompt; the paper does not state max_tokens,
  and only a near-window limit lets 1.5B reach its published std (MATH: std 2587 on a mean of 606 needs rare
  runs of about 12k+ tokens). The same limit for every model (one max_model_len on 48 GB A6000s).
- ``STAGE_SIGMA_RANGE = (0.15, 0.5)``: run-to-run spread of one stage allowed to the solve. Sampling changes
  a stage's length by tens of percent, not by multiples; what is left of a published std beyond that comes
  from runaways, which is what a 1.5B model's CV of 2.9-4.3 implies (14B lands at 0.5 with almost none).
- ``LEN_DIFFICULTY = code 1.6, math 2.0`` (log tokens per unit difficulty): the hardest problems need about
  5x (code) and 7x (math) the tokens of the easiest, as a one-line HumanEval completion against a LeetCode
  hard, or a two-step word problem against a competition proof.
- ``LEN_PROMPT = 0.3``: a longer statement asks for more output (more cases, longer code).
- ``LEN_HIDDEN_SHARED = 0.25``, ``LEN_HIDDEN_MODEL = 0.1``: what the text does not reveal about length.
- How the split between run noise and problem features was set (paper Table 3): the ceiling's Kendall-tau
  distance (``median_remaining`` against the realised remaining tokens, every stage request, real corpus)
  must not be worse than what the paper's learned QRF reached on real traces (0.124-0.270), or the
  instrument would be less predictable than the real models. A first setting (stage spread up to 1.0,
  difficulty 0.7 / 0.9, prompt 0.15) gave 0.24-0.29, so spread was moved from run noise to the problem
  features, giving 0.17-0.19 on code and 0.14-0.15 on math: inside the paper's range, not pushed to its best
  cells. That is the only adjustment made against a learning metric.
- ``RUNAWAY_DIFFICULTY = 1.5``: small models loop more on problems they cannot solve.
- ``SUCC_DIFFICULTY = code 3.5, math 4.0`` (logits per unit difficulty): easy to hard spans roughly 90% to 10%
  for a mid model, as levels 1 to 5 of MATH do for 7B-class models.
- ``SUCC_PROMPT = 0.25``: longer statements are slightly harder.
- ``SUCC_HIDDEN_SHARED = 1.0``, ``SUCC_HIDDEN_MODEL = 0.6``: unexplained hardness; the per-model part is what
  makes routing worth anything beyond "bigger is better" (paper Table 2: router mAP 0.52 APPS, 0.74 MATH).
- ``PARTIAL_CREDIT_RATE = 0.2``, ``U(0.05, 0.45)``: a wrong program still passes some tests now and then.
- ``ROLE_WEIGHT``: planner 0.5, coder/solver 1.0, QA 0.6, verifier 0.7, the revising second coder 0.9 /
  solver 0.8, a solo coder 1.2 / solver 1.15 (it plans in its own answer).
- ``WORKFLOW_LOGIT``: solo 0, planner + worker +0.15 code / +0.10 math, the four-stage review loop +0.35 /
  +0.30: reviewing helps a little, the paper reports no per-workflow scores.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.common.tokens import approx_tokens
from services.workload.corpus import Problem
from services.workload.models import MODELS, ModelSpec, Target, UnknownModel, resolve_model, target_for
from services.workload.workflows import Workflow, workflows_for

F64 = npt.NDArray[np.float64]

MAX_GEN_TOKENS = 30000
RUNAWAY_RANGE = (0.5, 1.25)
STAGE_SIGMA_RANGE = (0.15, 0.5)
LEN_DIFFICULTY = {"code": 1.6, "math": 2.0}
LEN_PROMPT = 0.3
LEN_HIDDEN_SHARED = 0.25
LEN_HIDDEN_MODEL = 0.1
RUNAWAY_DIFFICULTY = 1.5
SUCC_DIFFICULTY = {"code": 3.5, "math": 4.0}
SUCC_PROMPT = 0.25
SUCC_HIDDEN_SHARED = 1.0
SUCC_HIDDEN_MODEL = 0.6
PARTIAL_CREDIT_RATE = 0.2
PARTIAL_LOW, PARTIAL_HIGH = 0.05, 0.45
PROMPT_CLIP = 1.5
ROLE_WEIGHT: dict[str, tuple[float, ...]] = {
    "code/planner-coder-qa-coder": (0.5, 1.0, 0.6, 0.9),
    "code/planner-coder": (0.5, 1.0),
    "code/coder": (1.2,),
    "math/planner-solver-verifier-solver": (0.5, 1.0, 0.7, 0.8),
    "math/planner-solver": (0.5, 1.0),
    "math/solver": (1.15,),
}
WORKFLOW_LOGIT: dict[str, float] = {
    "code/planner-coder-qa-coder": 0.35,
    "code/planner-coder": 0.15,
    "code/coder": 0.0,
    "math/planner-solver-verifier-solver": 0.30,
    "math/planner-solver": 0.10,
    "math/solver": 0.0,
}
CEILING_DRAWS = 512


@dataclass(frozen=True, slots=True)
class Outcome:
    problem_id: str
    workflow: str
    model: str  # canonical model key
    seed: int
    stage_tokens: tuple[int, ...]
    finish_reasons: tuple[str, ...]  # "stop" | "length" per stage
    success: bool
    score: float  # task score: 1/0 for math, share of tests passed for code
    # The ceiling a learner can reach for this (problem, workflow, model): not knowable from a run alone.
    p_success: float
    expected_score: float
    median_remaining: tuple[int, ...]  # per stage: median of this and later stages' tokens
    p90_remaining: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return sum(self.stage_tokens)


@dataclass(frozen=True, slots=True)
class Calibration:
    """Solved parameters of one (model, domain) and what the solve reached on the calibration draws."""

    model: str
    domain: str
    target: Target
    body_scale: float
    stage_sigma: float  # log-sd of one stage's length around its expectation
    runaway_rate: float
    success_intercept: float
    fitted_mean: float
    fitted_std: float
    fitted_score: float


@dataclass(frozen=True, slots=True)
class _Terms:
    """The per-(problem, model) parts of the model that do not depend on the run."""

    len_log: float  # f in the docstring
    runaway_mult: float
    succ_logit: float  # everything but theta and the workflow term


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _runaway_tokens(u: F64) -> F64:
    lo, hi = RUNAWAY_RANGE
    out: F64 = np.minimum(np.ceil(MAX_GEN_TOKENS * (lo + (hi - lo) * u)), MAX_GEN_TOKENS)
    return out


def _runaway_moments() -> tuple[float, float]:
    """E[R] and E[R^2] of the runaway length R = MAX_GEN_TOKENS * min(1, U(lo, hi))."""
    lo, hi = RUNAWAY_RANGE
    below = (1 - lo) / (hi - lo)  # share of runaways that stop before the cap
    r1 = below * (1 + lo) / 2 + (1 - below)
    r2 = below * (1 + lo + lo * lo) / 3 + (1 - below)
    return MAX_GEN_TOKENS * r1, MAX_GEN_TOKENS**2 * r2


def _expected_score(p: F64 | float, domain: str) -> F64 | float:
    return p + (1 - p) * PARTIAL_CREDIT_RATE * (PARTIAL_LOW + PARTIAL_HIGH) / 2 if domain == "code" else p


def _sigmoid(x: F64) -> F64:
    out: F64 = 1.0 / (1.0 + np.exp(-x))
    return out


class OutcomeModel:
    """Seeded outcome model calibrated on a corpus (see the module docstring).

    Outcomes are a pure function of (problem, workflow, model, seed), the corpus it was calibrated on (which
    fixes the feature centring and the solved parameters) and ``world_seed`` (which fixes the hidden factors).
    """

    def __init__(self, problems: Sequence[Problem], models: Sequence[str] = (), world_seed: int = 0) -> None:
        self.world_seed = world_seed
        self._specs = tuple(resolve_model(m) for m in models) if models else MODELS
        self._centre: dict[str, tuple[float, float]] = {}
        self._problems: dict[str, list[Problem]] = {}
        for domain in ("code", "math"):
            ps = [p for p in problems if p.domain == domain]
            if ps:
                logs = np.log([max(1, approx_tokens(p.text)) for p in ps])
                self._centre[domain] = (float(np.mean([p.difficulty for p in ps])), float(np.median(logs)))
                self._problems[domain] = ps
        if not self._problems:
            raise ValueError("the outcome model needs at least one problem to calibrate on")
        # The ceiling does not depend on the run seed: memoised per instance, it costs one Monte Carlo per
        # (problem, workflow, model) however many runs are drawn.
        self._ceiling = functools.lru_cache(maxsize=1 << 16)(self._ceiling_uncached)
        self._cal = {
            (spec.key, domain): self._calibrate(spec, domain)
            for spec in self._specs
            for domain in self._problems
        }

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(s.key for s in self._specs)

    def calibration(self, model: str, domain: str) -> Calibration:
        return self._cal[resolve_model(model).key, domain]

    def _terms(self, problem: Problem, spec: ModelSpec) -> _Terms:
        d_mean, l_median = self._centre[problem.domain]
        dd = problem.difficulty - d_mean
        dl = min(PROMPT_CLIP, max(-PROMPT_CLIP, math.log(max(1, approx_tokens(problem.text))) - l_median))
        shared = np.random.default_rng(_seed("problem", self.world_seed, problem.id)).standard_normal(2)
        own = np.random.default_rng(_seed("pm", self.world_seed, problem.id, spec.key)).standard_normal(2)
        dom = problem.domain
        return _Terms(
            len_log=LEN_DIFFICULTY[dom] * dd
            + LEN_PROMPT * dl
            + LEN_HIDDEN_SHARED * shared[0]
            + LEN_HIDDEN_MODEL * own[0],
            runaway_mult=math.exp(RUNAWAY_DIFFICULTY * dd),
            succ_logit=-SUCC_DIFFICULTY[dom] * dd
            - SUCC_PROMPT * dl
            - SUCC_HIDDEN_SHARED * shared[1]
            + SUCC_HIDDEN_MODEL * own[1],
        )

    def _calibrate(self, spec: ModelSpec, domain: str) -> Calibration:
        target = target_for(spec, domain)
        problems = self._problems[domain]
        wfs = workflows_for(domain)
        terms = [self._terms(p, spec) for p in problems]
        weights = np.zeros((len(wfs), 4))
        for k, wf in enumerate(wfs):
            weights[k, : wf.n_stages] = ROLE_WEIGHT[wf.name]
        # (problem, workflow, stage) grids; every (problem, workflow) pair is equally likely.
        base = weights[None] * np.exp(np.array([t.len_log for t in terms]))[:, None, None]
        mult = np.array([t.runaway_mult for t in terms])[:, None, None] * (weights[None] > 0)
        r1, r2 = _runaway_moments()

        def moments(sigma: float, rate: float) -> tuple[float, float]:
            """Body scale that meets the target mean, and the std of the total it gives (exact moments)."""
            q = np.minimum(1.0, rate * mult)
            scale = (target.length_mean - float((q * r1).sum(-1).mean())) / float(
                ((1 - q) * base).sum(-1).mean()
            )
            m1 = (1 - q) * scale * base + q * r1
            m2 = (1 - q) * (scale * base) ** 2 * math.exp(sigma**2) + q * r2
            mean_pw = m1.sum(-1)
            second = float(((m2 - m1**2).sum(-1) + mean_pw**2).mean())
            return scale, math.sqrt(max(0.0, second - float(mean_pw.mean()) ** 2))

        # First widen the per-stage spread (no runaways), and only when the widest allowed spread still falls
        # short of the target std, add runaways: a large model's tail is ordinary variation, a small one's is
        # repetition loops.
        sig_lo, sig_hi = STAGE_SIGMA_RANGE
        rate = 0.0
        if moments(sig_hi, 0.0)[1] >= target.length_std:
            for _ in range(40):
                mid = (sig_lo + sig_hi) / 2
                sig_lo, sig_hi = (sig_lo, mid) if moments(mid, 0.0)[1] > target.length_std else (mid, sig_hi)
            sigma = sig_lo
        else:
            sigma, lo, hi = sig_hi, 0.0, 0.5
            for _ in range(50):
                mid = (lo + hi) / 2
                s_mid, std_mid = moments(sigma, mid)
                lo, hi = (lo, mid) if s_mid <= 0 or std_mid > target.length_std else (mid, hi)
            rate = lo
        scale, std = moments(sigma, rate)
        theta, fitted_score = self._solve_intercept(terms, wfs, domain, target.score)
        return Calibration(
            model=spec.key,
            domain=domain,
            target=target,
            body_scale=float(scale),
            stage_sigma=sigma,
            runaway_rate=rate,
            success_intercept=theta,
            fitted_mean=target.length_mean,
            fitted_std=std,
            fitted_score=fitted_score,
        )

    @staticmethod
    def _solve_intercept(
        terms: Sequence[_Terms], wfs: Sequence[Workflow], domain: str, score: float
    ) -> tuple[float, float]:
        base = np.array([t.succ_logit for t in terms])[:, None] + np.array(
            [WORKFLOW_LOGIT[w.name] for w in wfs]
        )
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if float(np.mean(_expected_score(_sigmoid(base + mid), domain))) < score:
                lo = mid
            else:
                hi = mid
        theta = (lo + hi) / 2
        return theta, float(np.mean(_expected_score(_sigmoid(base + theta), domain)))

    def _stage_draws(
        self, rng: np.random.Generator, k: int, terms: _Terms, cal: Calibration, weights: F64
    ) -> tuple[F64, npt.NDArray[np.bool_]]:
        n = weights.size
        body = cal.body_scale * weights * math.exp(terms.len_log)
        sigma = cal.stage_sigma
        body = body * np.exp(sigma * rng.standard_normal((k, n)) - sigma**2 / 2)
        run = rng.random((k, n)) < cal.runaway_rate * terms.runaway_mult
        tokens = np.where(run, _runaway_tokens(rng.random((k, n))), np.clip(np.rint(body), 1, MAX_GEN_TOKENS))
        return tokens, run

    def sample(self, problem: Problem, workflow: Workflow, model: str, seed: int) -> Outcome:
        """One run of ``model`` on ``problem`` with ``workflow``; the same arguments give the same outcome."""
        if workflow.domain != problem.domain:
            raise ValueError(f"workflow {workflow.name} does not fit a {problem.domain} problem")
        spec = resolve_model(model)
        if (spec.key, problem.domain) not in self._cal:
            raise UnknownModel(
                f"{spec.key} on {problem.domain} was not calibrated here (models: {self.models})"
            )
        cal = self._cal[spec.key, problem.domain]
        terms = self._terms(problem, spec)
        weights = np.array(ROLE_WEIGHT[workflow.name])
        rng = np.random.default_rng(_seed("run", self.world_seed, problem.id, workflow.name, spec.key, seed))
        tokens, _ = self._stage_draws(rng, 1, terms, cal, weights)
        p = float(
            _sigmoid(np.array(cal.success_intercept + WORKFLOW_LOGIT[workflow.name] + terms.succ_logit))
        )
        u_success, u_partial, u_credit = rng.random(3)
        success = bool(u_success < p)
        partial = problem.domain == "code" and u_partial < PARTIAL_CREDIT_RATE
        credit = round(PARTIAL_LOW + (PARTIAL_HIGH - PARTIAL_LOW) * float(u_credit), 3)
        score = 1.0 if success else (credit if partial else 0.0)
        median, p90 = self._ceiling(problem, workflow, spec)
        stage = tuple(int(t) for t in tokens[0])
        return Outcome(
            problem_id=problem.id,
            workflow=workflow.name,
            model=spec.key,
            seed=seed,
            stage_tokens=stage,
            finish_reasons=tuple("length" if t >= MAX_GEN_TOKENS else "stop" for t in stage),
            success=success,
            score=score,
            p_success=p,
            expected_score=float(_expected_score(p, problem.domain)),
            median_remaining=median,
            p90_remaining=p90,
        )

    def _ceiling_uncached(
        self, problem: Problem, workflow: Workflow, spec: ModelSpec
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Median and p90 of the remaining tokens at each stage, over the run-to-run randomness only."""
        cal = self._cal[spec.key, problem.domain]
        rng = np.random.default_rng(_seed("ceiling", self.world_seed, problem.id, workflow.name, spec.key))
        draws, _ = self._stage_draws(
            rng, CEILING_DRAWS, self._terms(problem, spec), cal, np.array(ROLE_WEIGHT[workflow.name])
        )
        remaining = np.cumsum(draws[:, ::-1], axis=1)[:, ::-1]
        q = np.rint(np.quantile(remaining, [0.5, 0.9], axis=0))
        return tuple(int(x) for x in q[0]), tuple(int(x) for x in q[1])
