"""What one request may cost, checked at submission (422 naming the knob to lower).

An analysis projects every (detailed head, prompt position) subheadvalue onto the vocabulary
(compute ∝ tokens × heads) and stores, per detailed head, one entry per position and four top-k
token lists per label position (at most one label per two tokens: size ∝ tokens × heads × k).
Its cost, in units that track both:

    cost = prompt tokens × detailed heads × (2 × top_k_tokens + 4)

with detailed heads = top_k_heads + extra_heads. The default request on a 512-token prompt
(20 heads, 10 tokens) costs 245,760; the limit is `ICL_MAX_ANALYSIS_COST` (300,000: about
10 MB of result JSON). A head whose score is decomposed (`towers`, docs/towers.md) is a
detailed head and costs TOWERS_HEADS more: an on-demand detail or decomposition is an extra
analysis, priced whole. An experiment's cost is its `n` (prompts), limited by
`ICL_MAX_EXPERIMENT_N`.

Activation patching is priced in forward passes × prompt tokens (a backward pass counted as
one more forward pass), `ICL_MAX_PATCH_COST`: per direction, attribution (2 passes) and one
batched row per exact patch (the unpatched base, the top_k heads, each layer's attention and
FFN, each per-position head at every position, the query, keys and values of qkv_heads), plus
the clean and corrupted recordings and the direct effects (3 passes). Adding heads patched
per position to a finished patch (model_worker.checks.patch_reuse) costs only the added rows:
the two recordings, and per direction attribution (2 passes) and each added head at every
position.
"""

from __future__ import annotations

from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import ExperimentRequest
from model_worker.contracts.patching import PatchRequest

#: Per (token, head): one projection for the per-position increase, plus the views' overhead.
FIXED_UNITS = 4


class BudgetError(ValueError):
    """A request over the budget; the message names the knob to lower and by how much."""


#: What decomposing one head's score costs, in detailed heads (two key positions, each a
#: query-side × key-side component table and a token matrix).
TOWERS_HEADS = 2
#: The knob of the patching budget.
PATCH_KNOB = "ICL_MAX_PATCH_COST"


def named_heads(request: AnalysisRequest) -> set[str]:
    """The heads a request has detailed beyond the top K: its extra heads, those whose label
    keys it asks for and those it decomposes."""
    keyed = [] if request.label_keys == "all" else request.label_keys
    return set(request.extra_heads) | set(keyed) | set(request.towers)


def detailed_heads(request: AnalysisRequest) -> int:
    return request.top_k_heads + len(named_heads(request)) + TOWERS_HEADS * len(request.towers)


def analysis_cost(n_tokens: int, request: AnalysisRequest) -> int:
    """The cost units of analysing `request` on a prompt of `n_tokens` tokens."""
    return n_tokens * detailed_heads(request) * (2 * request.top_k_tokens + FIXED_UNITS)


def check_analysis(n_tokens: int, request: AnalysisRequest, limit: int) -> None:
    """BudgetError when `request` costs more than `limit`, saying which knob to lower."""
    cost = analysis_cost(n_tokens, request)
    if cost <= limit:
        return
    heads, per_token = detailed_heads(request), 2 * request.top_k_tokens + FIXED_UNITS
    extra = heads - request.top_k_heads
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
    """BudgetError when the experiment asks for more prompts than `max_n` (n per seed, times
    its seeds)."""
    seeds = max(1, len(request.seeds))
    if request.n * seeds > max_n:
        asked = f"n = {request.n} prompts" + (f" × {seeds} seeds" if seeds > 1 else "")
        raise BudgetError(
            f"this experiment is over the budget: {asked}, the limit is {max_n} "
            "(ICL_MAX_EXPERIMENT_N); lower n" + (" or use fewer seeds" if seeds > 1 else "")
        )


def patch_rows(request: PatchRequest, n_tokens: int, n_layers: int, n_heads: int) -> int:
    """Exactly patched rows of one direction (each a forward pass over the prompt)."""
    top_k = min(request.top_k, n_layers * n_heads)
    per_position = max(1, len(request.heads)) * n_tokens
    return 1 + top_k + 2 * n_layers + per_position + 3 * request.qkv_heads


def patch_passes(request: PatchRequest, n_tokens: int, n_layers: int, n_heads: int) -> int:
    """Forward passes of a patching job (a backward pass counted as one)."""
    per_direction = 2 + patch_rows(request, n_tokens, n_layers, n_heads)
    return 3 + len(request.directions) * per_direction


def added_passes(request: PatchRequest, added: int, n_tokens: int) -> int:
    """Forward passes of adding `added` heads patched per position to a finished patch."""
    return 2 + len(request.directions) * (2 + added * n_tokens)


def check_patch(
    request: PatchRequest,
    n_tokens: int,
    n_layers: int,
    n_heads: int,
    limit: int,
    added: int | None = None,
) -> None:
    """BudgetError when patching `request` on a prompt of `n_tokens` tokens costs more than
    `limit` forward passes × tokens, naming the knobs to lower (the largest share first).
    `added`: the request adds that many heads to a finished patch, and only they are priced."""
    if added is not None:
        passes = added_passes(request, added, n_tokens)
        if passes * n_tokens > limit:
            raise BudgetError(
                f"adding {added} head(s) patched per position is over the budget: {passes:,} "
                f"forward passes × {n_tokens} prompt tokens = {passes * n_tokens:,}, the limit "
                f"is {limit:,} ({PATCH_KNOB}); add fewer heads at once, or patch a shorter prompt"
            )
        return
    passes = patch_passes(request, n_tokens, n_layers, n_heads)
    cost = passes * n_tokens
    if cost <= limit:
        return
    directions = len(request.directions)
    per_position = max(1, len(request.heads))
    shares = [  # (passes a knob adds, how to lower it)
        (
            directions * per_position * n_tokens,
            f"heads patched per position ({per_position} × {n_tokens} positions)"
            + ("; each costs a pass per token" if request.heads else ": the default is one"),
        ),
        (directions * min(request.top_k, n_layers * n_heads), f"top_k ({request.top_k})"),
        (directions * 3 * request.qkv_heads, f"qkv_heads ({request.qkv_heads})"),
    ]
    options = [how for added, how in sorted(shares, reverse=True) if added > 0]
    if directions > 1:
        options.append("directions to one of denoising, noising")
    options.append("the prompt's length")
    raise BudgetError(
        f"this patching job is over the budget: {passes:,} forward passes × {n_tokens} prompt "
        f"tokens = {cost:,}, the limit is {limit:,} ({PATCH_KNOB}); lower " + ", ".join(options)
    )
