"""`icl_heads.patch`: activation patching of one prompt against a corrupted one, locally.

import icl_heads
model = icl_heads.load_model()
result = icl_heads.patch(model, "love : bar like : bar eight : foo two : foo one :")
result.direction("denoising").heads            # every head: attribution, exact (top-k)
"""

from __future__ import annotations

from typing import Any

from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.model.loading import LoadedModel
from model_worker.patching.run import patch as engine_patch


def patch(
    model: LoadedModel,
    prompt: str,
    corruption: str = "swap-labels",
    *,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    **options: Any,
) -> PatchingResult:
    """Patch `prompt` against its corruption (`swap-labels`, `query`, or `prompt` with
    `corrupted_prompt=`); `options` are PatchRequest's other fields (target, labels, top_k,
    heads, qkv_heads, directions). A bad request raises a ValueError (pydantic's
    ValidationError, or a UserInputError of one sentence)."""
    request = PatchRequest(prompt=prompt, corruption=corruption, **options)
    return engine_patch(model, request, max_tokens)
