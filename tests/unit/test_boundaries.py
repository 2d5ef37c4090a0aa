"""The boundaries that pyproject.toml's import-linter contracts draw: every module of app/ is
in exactly one of the shared kernel, the views and the web layer; results draw themselves only
with the views a notebook installs; library calls ignore ICL_* settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest
import torch

from model_worker.model.loading import load_model
from model_worker.model.prompting import encode_prompt
from model_worker.run.analyze import analyze
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2

ROOT = Path(__file__).resolve().parents[2]


def test_the_contracts_are_layers_without_exemptions() -> None:
    """The import rules are a layers contract (library/CLI, web tier and views, engine) plus
    forbidden rules, with no `ignore_imports` exemptions and no hand-kept module lists."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = [c for c in contracts if c["type"] == "layers"]
    assert [c["layers"] for c in layers if "containers" not in c] == [
        ["icl_heads", "app", "model_worker"]
    ]
    assert not [c["name"] for c in contracts if c.get("ignore_imports")]


def test_the_engines_rooms_are_layers_with_the_service_above_the_methods() -> None:
    """Inside model_worker/ the rooms are layers: the service calls the methods, the methods
    use the model and resources, never the service; every room of the engine is named once."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (rooms,) = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers")]
    assert rooms["containers"] == ["model_worker"]
    named = [name.strip() for layer in rooms["layers"] for name in layer.split("|")]
    assert named[0] == "service"
    methods = ["experiments", "patching", "run", "towers"]
    assert all(named.index(m) < named.index("model") for m in methods)
    on_disk = sorted(
        p.name for p in (ROOT / "model_worker").iterdir() if (p / "__init__.py").is_file()
    )
    assert sorted(named) == on_disk
    loose = sorted(p.name for p in (ROOT / "model_worker").glob("*.py") if p.stem != "__init__")
    assert loose == [], f"modules outside a room: {loose}"


def test_the_engine_never_imports_the_web_tier() -> None:
    """No module of model_worker/ imports app/, at any depth (grimp's graph, as lint-imports)."""
    graph = grimp.build_graph("model_worker", "app")
    edges = [
        (m, i)
        for m in graph.modules
        if m.startswith("model_worker")
        for i in graph.find_modules_directly_imported_by(m)
        if i == "app" or i.startswith("app.")
    ]
    assert edges == []


def test_results_draw_themselves_only_as_the_librarys_results() -> None:
    """The engine's contracts carry no presentation and no global hook switches it on: the
    engine's result has no HTML; the library's (`icl_heads.analyze`) draws the dashboard's
    figures, and converting one into the other shares its data."""
    import icl_heads
    from icl_heads.results import AnalysisResult

    engine_result = analyze(tiny_gpt2(), EXAMPLE_PROMPT, top_k_heads=1)
    assert not hasattr(engine_result, "_repr_html_")
    assert not hasattr(engine_result.head(engine_result.top_heads[0]), "_repr_html_")
    shown = AnalysisResult.of(engine_result)
    assert shown.heads is engine_result.heads
    assert 'data-figure="heatmap"' in shown._repr_html_()
    assert 'data-figure="heatmap"' in icl_heads.analyze(tiny_gpt2(), EXAMPLE_PROMPT)._repr_html_()
    assert shown.model_dump_json() == engine_result.model_dump_json()


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
    from model_worker.common.settings import get_settings

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
