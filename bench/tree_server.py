"""Serves one checkout of the explorer (its own `app`, `model_worker` and templates) on a port,
for bench_browser.py's before/after comparison: two commits cannot share one Python process.

    python bench/tree_server.py TREE PORT DATA_DIR

The model is a random Llama of SmolLM2-135M's shape as the pages see it (30 layers × 9 query
heads on 3 K/V heads: a 270-cell heatmap, 20 detailed heads) with a small hidden size and the
tests' word tokenizer, so that the model's compute stays small and alike for both commits: the
comparison is of the web and browser path (HTML, scripts, figures). Built from the TREE's own
`tests/tiny_models.py` and `model_worker.model.loading.wrap_model`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def smol_shaped(hidden_size: int = 144) -> Any:
    """A random LlamaForCausalLM with SmolLM2-135M's layers and heads (30 × 9 on 3 K/V heads),
    `hidden_size` wide, over the word tokenizer's vocabulary (`tests.tiny_models` of whichever
    tree is on the path), seeded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_models import WORDS

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=1024,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def main() -> None:
    tree, port, data_dir = Path(sys.argv[1]).resolve(), int(sys.argv[2]), Path(sys.argv[3])
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    import uvicorn

    from app.main import create_app
    from icl_heads.serving import embedded_backend
    from model_worker.common.settings import Settings
    from model_worker.model.loading import LoadedModel, wrap_model
    from tests.tiny_models import word_tokenizer

    def loader() -> LoadedModel:
        return wrap_model(smol_shaped(), word_tokenizer(), name="smol-shaped")

    settings = Settings(model="smol-shaped", data_dir=data_dir)
    app = create_app(settings, embedded_backend(settings, loader=loader))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
