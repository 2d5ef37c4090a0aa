"""The boundaries that pyproject.toml's import-linter contracts draw: every module of app/ is
either in the shared kernel or in the web layer, and library calls ignore ICL_* settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest
import torch

from model_worker.analyze import analyze
from model_worker.loading import load_model
from model_worker.prompting import encode_prompt
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2

ROOT = Path(__file__).resolve().parents[2]


def _contract(name_start: str) -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"].startswith(name_start))


def test_every_app_module_is_kernel_or_web_layer() -> None:
    """A new module of app/ must be named in the kernel contract or in the web layer that the
    engine contract forbids: no module is neither, none is both."""
    kernel = set(_contract("The shared kernel")["source_modules"])
    web = {m for m in _contract("The engine")["forbidden_modules"] if m.startswith("app.")}
    graph = grimp.build_graph("app")
    packages = {"app", "app.queue"}  # split between kernel and web layer: their modules count
    for module in sorted(graph.modules - packages):
        in_kernel = any(module == k or module.startswith(k + ".") for k in kernel)
        in_web = any(module == w or module.startswith(w + ".") for w in web)
        assert in_kernel != in_web, f"{module}: name it in the kernel or the web layer"


#: Settings that would change a library call if it read them.
HOSTILE = {
    "ICL_MAX_PROMPT_TOKENS": "3",
    "ICL_DTYPE": "float16",
    "ICL_MODEL": "no-org/no-model",
    "ICL_WARM_UP": "false",
}


def test_notebook_calls_ignore_icl_variables_and_dotenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_model, encode_prompt and analyze behave the same with ICL_* variables set and a
    `.env` in the current folder: only the CLI, the worker and the web app read settings."""
    from app.settings import get_settings

    folder = tmp_path / "model"
    built = tiny_gpt2()
    built.model.save_pretrained(folder)
    built.tokenizer.save_pretrained(folder)
    before = analyze(load_model(str(folder)), EXAMPLE_PROMPT, top_k_heads=2)

    (tmp_path / ".env").write_text("ICL_MAX_PROMPT_TOKENS=2\nICL_DTYPE=bfloat16\n")
    monkeypatch.chdir(tmp_path)
    for name, value in HOSTILE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ICL_CACHE_DIR", str(tmp_path / "elsewhere"))
    get_settings.cache_clear()
    try:
        assert get_settings().max_prompt_tokens == 3  # the settings do see them
        loaded = load_model(str(folder))
        assert next(loaded.model.parameters()).dtype == torch.float32
        assert len(encode_prompt(loaded, EXAMPLE_PROMPT).ids) > 3
        after = analyze(loaded, EXAMPLE_PROMPT, top_k_heads=2)
    finally:
        get_settings.cache_clear()
    assert after.model_dump() == before.model_dump()
    assert not (tmp_path / "elsewhere").exists()
