"""Checks that say what a result means: the coded warnings of an analysis or an experiment.

Torch-free: they read the result's own fields, so a page, the CLI and a notebook all show the
same sentences, once each.
"""

from __future__ import annotations

from model_worker.common.token_quote import quoted
from model_worker.contracts.analysis import AnalysisCore
from model_worker.contracts.caveats import ResultWarning

#: Below this probability the target is not what the model would say: its increases explain
#: a token the model does not predict.
UNLIKELY_TARGET = 0.01
#: Fewer prompts than this give no meaningful sd, percentage or rank correlation.
MIN_PROMPTS = 5
#: How many of the top heads the recompute-mode check looks at.
TOP_CHECKED = 5


def _quoted(words: list[str]) -> str:
    return ", ".join(quoted(word) for word in dict.fromkeys(words))


def analysis_warnings(result: AnalysisCore) -> list[ResultWarning]:
    """The caveats of `result`, one per kind (never one per label), in reading order."""
    warnings: list[ResultWarning] = []
    target = result.target
    if result.separator is None:
        warnings.append(
            ResultWarning(
                code="no_icl_shape",
                message="The prompt has no ICL shape (demonstrations “input : label”, then the "
                "query and the separator): no labels are marked, so the label / other split, the "
                "attention on labels, MRR and the label flow are left out. End the prompt with "
                "the separator, e.g. “great : 1 awful : 0 fine :”.",
            )
        )
    elif not result.labels:
        warnings.append(
            ResultWarning(
                code="no_labels",
                message=f"No labels found after the separator {quoted(result.separator)}: the "
                "label / other split, the attention on labels, MRR and the label flow are left "
                "out. Give the labels (e.g. “1, 0”) if the prompt has them.",
            )
        )
    if result.labels:
        words = [label.word for label in result.labels]
        n_true = sum(label.is_true for label in result.labels)
        if n_true == 0:
            warnings.append(
                ResultWarning(
                    code="target_not_label",
                    message=f"The target {quoted(target.token)} is none of the labels "
                    f"({_quoted(words)}): every label is marked false and attention on true "
                    "labels is 0 in every head.",
                )
            )
        elif n_true == len(result.labels):
            warnings.append(
                ResultWarning(
                    code="labels_all_true",
                    message=f"Every label is the target {quoted(target.token)}: nothing tells true "
                    "from false labels, so attention on false labels is 0 in every head.",
                )
            )
    if target.prob < UNLIKELY_TARGET:
        warnings.append(
            ResultWarning(
                code="target_unlikely",
                message=f"The model gives the target {quoted(target.token)} p = {target.prob:.2g} "
                f"(below {UNLIKELY_TARGET:.0%}): the heads explain a token it does not predict.",
            )
        )
    if result.norm == "recompute":
        early = 1 if result.n_layers < 8 else 2
        near = [h.name for h in result.heads[:TOP_CHECKED] if h.layer < early]
        if near:
            warnings.append(
                ResultWarning(
                    code="recompute_embedding_heads",
                    message=f"In recompute mode {', '.join(near)} rank among the top heads: "
                    "heads next to the embedding change the final norm's scale more than what "
                    "they write. Compare with norm = fixed before calling them in-context heads.",
                )
            )
    return warnings


def sample_warnings(n: int, statistics: str = "sd, percentages and ρ") -> list[ResultWarning]:
    """The `small_sample` caveat of an experiment over `n` prompts (none from MIN_PROMPTS on)."""
    if n >= MIN_PROMPTS:
        return []
    prompts = "1 prompt" if n == 1 else f"{n} prompts"
    return [
        ResultWarning(
            code="small_sample",
            message=f"Only {prompts}: the {statistics} below mean little from fewer than "
            f"{MIN_PROMPTS} prompts (the paper uses 200); run with a larger n.",
        )
    ]
