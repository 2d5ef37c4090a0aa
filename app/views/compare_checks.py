"""What a comparison of two analyses means: warnings when A and B do not ask the same question."""

from __future__ import annotations

from model_worker.contracts.analysis import AnalysisCore


def _words(result: AnalysisCore) -> list[str]:
    return sorted({label.word for label in result.labels})


def comparison_warnings(a: AnalysisCore, b: AnalysisCore) -> list[str]:
    """One sentence per way A and B differ beyond their prompts (model, target, labels, norm,
    ranking): B − A then mixes that difference into every head's change."""
    warnings = []
    if a.model != b.model:
        warnings.append(
            f"A and B come from different models ({a.model!r} and {b.model!r}): a head of one "
            "is not the same head of the other."
        )
    if a.target.token != b.target.token:
        warnings.append(
            f"A and B analyse different targets (A {a.target.token!r}, B {b.target.token!r}): "
            "each head's increase is for another token, so B − A is not one head's change."
        )
    if _words(a) != _words(b):
        shown = [", ".join(repr(w) for w in _words(r)) or "none" for r in (a, b)]
        warnings.append(f"A and B have different labels (A: {shown[0]}; B: {shown[1]}).")
    if a.norm != b.norm:
        warnings.append(f"A and B use different norm modes (A {a.norm}, B {b.norm}).")
    if a.rank_by != b.rank_by:
        warnings.append(f"A and B rank heads differently (A by {a.rank_by}, B by {b.rank_by}).")
    return warnings


def shared_domain(a: AnalysisCore, b: AnalysisCore) -> tuple[float, float]:
    """One colour scale for A's and B's heatmaps: ± the largest |value| either draws (the label
    increase where an analysis ranks by it), so equal colours mean equal increases."""
    values = [
        abs(getattr(h, "label_increase" if r.rank_by == "label" else "increase") or 0.0)
        for r in (a, b)
        for h in r.heads
    ]
    limit = max(values, default=0.0) or 1e-9
    return (-limit, limit)
