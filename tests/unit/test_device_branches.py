"""A GPU's branches of an analysis taken on the CPU (`model_worker.resources.device_branches`): no
Taylor expansion, several factored heads a block of logits, ranks in one comparison. They answer as
the CPU's own branches do, so the path a GPU runs is tested where there is no GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from model_worker.analysis import details as details_module
from model_worker.analysis.metrics import rank_at_once, rank_of
from model_worker.model.loading import LoadedModel
from model_worker.resources.device_branches import gpu_branches, host_bound
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT
from tests.unit.test_head_unembeddings import agree

PROMPT = " ".join([EXAMPLE_PROMPT.removesuffix(" one :")] * 3) + " one :"


def test_the_switch_is_scoped_and_the_cpu_alone_is_not_host_bound() -> None:
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert not host_bound(cpu) and host_bound(meta)
    with gpu_branches():
        assert host_bound(cpu)
    assert not host_bound(cpu)


def test_ranks_in_one_comparison_equal_the_cpus_blocked_count() -> None:
    logits = torch.randn(9, 3000, generator=torch.Generator().manual_seed(2))
    reference = logits[:, [4]]
    assert torch.equal(rank_at_once(logits, reference), rank_of(logits, reference))


def test_a_gpus_branches_answer_as_the_cpus(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heads recurring (their U_h kept): on the CPU's branches each head's values are one block
    and small writes go through the expansion; on a GPU's, blocks hold several heads and every
    write is projected. Same numbers (to 1e-4), same top tokens, same label ranks."""
    options: dict[str, Any] = {"target": "foo", "top_k_heads": 4}
    tiny_model.head_unembeddings = HeadUnembeddings()
    for _ in range(2):  # the second sighting builds every detailed head's U_h
        analyze(tiny_model, PROMPT, **options)
    seen: list[tuple[int | None, bool]] = []
    real = details_module.position_views_fixed

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((kwargs["chunk"], kwargs["small"] is not None))
        return real(*args, **kwargs)

    monkeypatch.setattr(details_module, "position_views_fixed", spy)
    cpu = analyze(tiny_model, PROMPT, **options)
    with gpu_branches():
        gpu = analyze(tiny_model, PROMPT, **options)
    (cpu_chunk, cpu_small), (gpu_chunk, gpu_small) = seen
    assert cpu_chunk is not None and cpu_small  # one head a block, the expansion asked
    assert gpu_chunk is None and not gpu_small
    agree(gpu, cpu)
