"""What a result means, said in words: structured warnings on analyses and experiments.

A warning is a stable `code` (clients, pages and tests select on it) and one sentence. Results
stored before warnings had codes carried plain sentences: they are read back as code `note`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

#: Every warning a result can carry.
WarningCode = Literal[
    "no_icl_shape",  # the prompt does not end with a separator seen earlier
    "no_labels",  # a separator, but no label words after it
    "target_not_label",  # the target is none of the labels: every label is false
    "labels_all_true",  # every label is the target: nothing to tell true from false
    "target_unlikely",  # the target's probability is below 1%
    "target_multi_token",  # the target is several tokens: its first is analysed
    "recompute_embedding_heads",  # recompute mode ranks heads next to the embedding on top
    "small_sample",  # an experiment's statistics come from fewer than 5 prompts
    "note",  # a plain sentence of a result stored before warnings had codes
]


class ResultWarning(BaseModel):
    """A caveat on a result: `code` (WarningCode) and `message`, one sentence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: WarningCode
    message: str


def _coded(value: Any) -> Any:
    """A stored plain-sentence warning as a `note`; anything else as it is."""
    return {"code": "note", "message": value} if isinstance(value, str) else value


#: One warning of a result's `warnings`: a plain sentence of an older result is read as a `note`.
CodedWarning = Annotated[ResultWarning, BeforeValidator(_coded)]
