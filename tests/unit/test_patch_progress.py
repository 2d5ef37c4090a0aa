"""A patching job says how far it is (model_worker.patching.run.patch's `progress`): stages in
order, fractions rising from 0 towards 1, each direction's attribution then exact runs."""

from __future__ import annotations

from model_worker.contracts.patching import PatchRequest
from model_worker.patching.run import patch
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


def test_progress_goes_through_each_directions_stages_in_order() -> None:
    seen: list[tuple[float, str]] = []
    request = PatchRequest(prompt=EXAMPLE_PROMPT, labels=["foo", "bar"], top_k=2, qkv_heads=1)
    patch(tiny_llama(), request, progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] < 1.0
    stages = [m.split(":")[0] + (" exact" if "exactly" in m else "") for _, m in seen[1:]]
    assert stages == ["denoising", "denoising exact", "noising", "noising exact"]
    assert "recording" in seen[0][1]
