"""What one request may cost, checked at submission (422 naming the knob to lower).

An analysis projects every (detailed head, prompt position) subheadvalue onto the vocabulary
(compute ∝ tokens × heads) and stores, per detailed head, one entry per position and four top-k
token lists per label position (at most one label per two tokens: size ∝ tokens × heads × k).
Its cost, in units that track both:

    cost = prompt tokens × detailed heads × (2 × top_k_tokens + 4)

with detailed heads = top_k_heads + extra_heads. The default request on a 512-token prompt
(20 heads, 10 tokens) costs 245,760; the limit is `ICL_MAX_ANALYSIS_COST` (300,000: about
10 MB of result JSON). An experiment's cost is its `n` (prompts), limited by `ICL_MAX_EXPERIMENT_N`.
"""

from __future__ import annotations

from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest

#: Per (token, head): one projection for the per-position increase, plus the views' overhead.
FIXED_UNITS = 4


class BudgetError(ValueError):
    """A request over the budget; the message names the knob to lower and by how much."""


def named_heads(request: AnalysisRequest) -> set[str]:
    """The heads a request has detailed beyond the top K: its extra heads and those whose
    label keys it asks for."""
    keyed = [] if request.label_keys == "all" else request.label_keys
    return set(request.extra_heads) | set(keyed)


def detailed_heads(request: AnalysisRequest) -> int:
    return request.top_k_heads + len(named_heads(request))


def analysis_cost(n_tokens: int, request: AnalysisRequest) -> int:
    """The cost units of analysing `request` on a prompt of `n_tokens` tokens."""
    return n_tokens * detailed_heads(request) * (2 * request.top_k_tokens + FIXED_UNITS)


def check_analysis(n_tokens: int, request: AnalysisRequest, limit: int) -> None:
    """BudgetError when `request` costs more than `limit`, saying which knob to lower."""
    cost = analysis_cost(n_tokens, request)
    if cost <= limit:
        return
    heads, per_token = detailed_heads(request), 2 * request.top_k_tokens + FIXED_UNITS
    extra = len(named_heads(request))
    max_heads = limit // (n_tokens * per_token) - extra
    max_k = (limit // (n_tokens * heads) - FIXED_UNITS) // 2
    options = []
    if max_heads >= 1:
        options.append(f"top_k_heads to {max_heads}")
    if max_k >= 1:
        options.append(f"top_k_tokens to {max_k}")
    options.append("the prompt's length")
    raise BudgetError(
        f"this analysis is over the budget: {n_tokens} prompt tokens × {heads} detailed heads × "
        f"(2 × {request.top_k_tokens} top_k_tokens + {FIXED_UNITS}) = {cost:,} units, the limit "
        f"is {limit:,} (ICL_MAX_ANALYSIS_COST); lower " + " or ".join(options)
    )


def check_experiment(request: ExperimentRequest, max_n: int) -> None:
    """BudgetError when the experiment asks for more prompts than `max_n`."""
    if request.n > max_n:
        raise BudgetError(
            f"this experiment is over the budget: n = {request.n} prompts, the limit is {max_n} "
            "(ICL_MAX_EXPERIMENT_N); lower n"
        )
