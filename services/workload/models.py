"""The paper's six models and the statistics the outcome model is calibrated to.

Calibration targets (README section)
------------------------------------

None of the paper's models runs here, so their per-stage output lengths and success labels come from the
seeded outcome model in ``outcome.py``, a *measuring instrument* calibrated to the numbers below. Each target
is "per (model, dataset), over the workload's problems with the three workflows of the dataset chosen
uniformly" (paper §5 says the user picks a workflow; the mix is not given, uniform is our assumption).

Total workflow output tokens, mean / std:

=================  ===============  ===============  =========================================================
model              code (APPS)      math (MATH)      source
=================  ===============  ===============  =========================================================
Qwen2.5-1.5B       447 / 1276       606 / 2587       paper §5, "Total workflow output lengths" [P]
Qwen2.5-3B         510 / 974        638 / 1736       interpolated, see below [I]
Qwen2.5-7B         586 / 700        677 / 1066       interpolated [I]
Qwen2.5-14B        649 / 534        709 / 715        paper §5 [P]
Llama-3.2-3B       1274 / 3186      1595 / 3987      "much longer" (paper App. A.2) [A]
Ministral-3-8B     1496 / 2244      1708 / 2562      "much longer" (paper App. A.2) [A]
=================  ===============  ===============  =========================================================

- [I] Qwen 3B and 7B: with t = ln(size / 1.5B) / ln(14B / 1.5B) (0.31 for 3B, 0.69 for 7B), the mean is linear
  in t between the published 1.5B and 14B means and the std is geometric (log-linear) in t, because the std
  falls 2.4-3.6x from 1.5B to 14B and a linear blend would overstate the mid sizes' tails.
- [A] Llama-3.2-3B and Ministral-3-8B-2512: the paper only says (App. A.2, figures) that their outputs are
  much longer; its vLLM latency for that pair is 14x the Qwen1.5B+7B pair at RPS 8 (1156.7 vs 82.6 ms/token,
  §7.3), consistent with far longer outputs. We assume ``LONG_FAMILY_FACTOR`` = 2.5 x the interpolated Qwen
  mean of the same size, a coefficient of variation of 2.5 for Llama-3B (heavy tail like the small Qwen) and
  1.5 for Ministral-8B (between the small and large Qwen).

Average task score (APPS: share of hidden tests passed; MATH: exact match), uniform workflow mix:

=================  ======  ======  ==================================================================
model              code    math    source
=================  ======  ======  ==================================================================
Qwen2.5-1.5B       0.14    0.55    code [A]; math: Qwen2.5 technical report, MATH 55.2 (instruct) [S]
Qwen2.5-3B         0.20    0.66    code [A]; math: same report, 65.9 [S]
Qwen2.5-7B         0.30    0.75    code [A]; math: same report, 75.5 [S]
Qwen2.5-14B        0.36    0.80    code [A]; math: same report, 80.0 [S]
Llama-3.2-3B       0.12    0.48    code [A]; math: Meta model card, MATH (CoT) 48.0 [S]
Ministral-3-8B     0.40    0.70    both [A]
=================  ======  ======  ==================================================================

- Code anchor [P]: vLLM on Qwen1.5B+7B scores 22.7 / 23.5 / 20.6 % on APPS at RPS 8 / 12 / 16 (§7.3); a load
  balanced mix of 0.14 and 0.30 gives about 0.22. 14B above 7B by the same size trend. Chimera's +15.7 pp over
  vLLM on Llama3B+Ministral8B (§7.3) needs a wide gap between those two: 0.12 vs 0.40.
- Math [S]: the published single-model MATH scores, quoted from memory of the cited reports (no network to
  re-check them here). Ministral-3-8B-Instruct-2512 has no figure we can cite: 0.70 places it between Qwen 3B
  and 7B.
- Tags: [P] the paper, [S] a secondary published source, [I] our interpolation, [A] our assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str  # Hugging Face id, as an engine would report it
    key: str  # short canonical key used in traces and tables
    family: str
    params_b: float


@dataclass(frozen=True, slots=True)
class Target:
    """What the outcome model reproduces for one (model, domain) over a uniform workflow mix."""

    length_mean: float
    length_std: float
    score: float


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("Qwen/Qwen2.5-1.5B-Instruct", "qwen2.5-1.5b", "qwen", 1.5),
    ModelSpec("Qwen/Qwen2.5-3B-Instruct", "qwen2.5-3b", "qwen", 3.0),
    ModelSpec("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", "qwen", 7.0),
    ModelSpec("Qwen/Qwen2.5-14B-Instruct", "qwen2.5-14b", "qwen", 14.0),
    ModelSpec("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b", "llama", 3.0),
    ModelSpec("mistralai/Ministral-3-8B-Instruct-2512", "ministral-8b", "ministral", 8.0),
)

# Paper §5 [P]: (mean, std) of total workflow output tokens for the two published Qwen sizes.
PUBLISHED_LENGTHS: tuple[tuple[str, str, float, float], ...] = (
    ("qwen2.5-1.5b", "code", 447.0, 1276.0),
    ("qwen2.5-1.5b", "math", 606.0, 2587.0),
    ("qwen2.5-14b", "code", 649.0, 534.0),
    ("qwen2.5-14b", "math", 709.0, 715.0),
)
LONG_FAMILY_FACTOR = 2.5  # [A] see the module docstring
LONG_FAMILY_CV = {"llama": 2.5, "ministral": 1.5}  # [A]
SCORES: tuple[tuple[str, float, float], ...] = (  # (key, code, math); sources in the module docstring
    ("qwen2.5-1.5b", 0.14, 0.55),
    ("qwen2.5-3b", 0.20, 0.66),
    ("qwen2.5-7b", 0.30, 0.75),
    ("qwen2.5-14b", 0.36, 0.80),
    ("llama-3.2-3b", 0.12, 0.48),
    ("ministral-8b", 0.40, 0.70),
)


class UnknownModel(KeyError):
    """A model name the outcome model has no calibration for."""


def _norm(name: str) -> str:
    base = name.strip().lower().rsplit("/", 1)[-1]
    return base.removesuffix("-instruct").replace("_", "-")


def _forms(spec: ModelSpec) -> set[str]:
    squeezed = f"{spec.family}{spec.params_b:g}b"  # "qwen1.5b", "llama3b", "ministral8b"
    return {f.replace("-", "") for f in (spec.key, _norm(spec.name), squeezed)}


def resolve_model(name: str) -> ModelSpec:
    """Accept a key ("qwen2.5-7b"), a Hugging Face id ("Qwen/Qwen2.5-7B-Instruct"),
    or a short form ("qwen7b")."""
    n = _norm(name).replace("-", "")
    for spec in MODELS:
        if n in _forms(spec):
            return spec
    raise UnknownModel(f"no calibration for model {name!r}; known: {[m.key for m in MODELS]}")


def _size_t(params_b: float) -> float:
    return math.log(params_b / 1.5) / math.log(14.0 / 1.5)


def target_for(spec: ModelSpec, domain: str) -> Target:
    """The calibration target of ``spec`` on ``domain`` ("code" | "math"), derived as the docstring states."""
    published = {(k, d): (m, s) for k, d, m, s in PUBLISHED_LENGTHS}
    (m_small, s_small), (m_large, s_large) = (
        published["qwen2.5-1.5b", domain],
        published["qwen2.5-14b", domain],
    )
    t = _size_t(spec.params_b)
    mean = m_small + (m_large - m_small) * t
    std = s_small * (s_large / s_small) ** t
    if spec.family != "qwen":
        mean *= LONG_FAMILY_FACTOR
        std = mean * LONG_FAMILY_CV[spec.family]
    if spec.key in ("qwen2.5-1.5b", "qwen2.5-14b"):
        mean, std = published[spec.key, domain]
    code, math_ = next((c, m) for k, c, m in SCORES if k == spec.key)
    return Target(length_mean=mean, length_std=std, score=code if domain == "code" else math_)
