"""Wang et al.'s saliency of the attention: I_l = |Σ_h A_{l,h} ⊙ ∂L/∂A_{l,h}| per layer, with
L = −log p(true label) at each prompt's last real token (summed over the batch's rows: each
row's loss depends on its own row's attention only).

One forward pass with gradients, then `torch.autograd.grad` with respect to each layer's
attention weights (the eager attention's returned probabilities, the tensor that multiplies
the values): no parameter gradient is computed or stored, the model is left untouched.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from model_worker.experiments.batching import Batch
from model_worker.model.loading import LoadedModel


def saliency(loaded: LoadedModel, batch: Batch) -> Tensor:
    """[B, L, S, S]: each row's saliency matrix per layer (padding rows/columns included;
    callers keep a row's first `last + 1` tokens)."""
    model, adapter, g = loaded.model, loaded.adapter, loaded.geometry
    patterns: list[Tensor] = []

    def keep_pattern(_m: nn.Module, _args: Any, output: Any) -> None:
        if len(output) < 2 or output[1] is None:
            raise RuntimeError("attention weights were not returned: load with eager attention")
        patterns.append(output[1])

    def needs_grad(_m: nn.Module, _args: Any, output: Tensor) -> Tensor:
        return output.detach().requires_grad_(True)

    spec = adapter.spec
    handles = [
        adapter.sub(model, layer, spec.attn).register_forward_hook(keep_pattern)
        for layer in range(g.n_layers)
    ]
    embeddings = cast(nn.Module, cast(Any, model).get_input_embeddings())
    handles.append(embeddings.register_forward_hook(needs_grad))
    device = loaded.device
    rows = torch.arange(len(batch.items))
    true_ids = torch.tensor([item.true_id for item in batch.items], device=device)
    try:
        with loaded.lock, torch.enable_grad():
            logits = model(
                input_ids=batch.input_ids.to(device),
                attention_mask=batch.attention_mask.to(device),
                use_cache=False,
            ).logits
            last = logits[rows, batch.last.to(device)]  # [B, V]
            loss = -torch.log_softmax(last.float(), -1)[rows, true_ids].sum()
            grads = torch.autograd.grad(loss, patterns)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(
        [
            (a.detach().float() * d.float()).sum(1).abs()
            for a, d in zip(patterns, grads, strict=True)
        ],
        dim=1,
    ).cpu()
