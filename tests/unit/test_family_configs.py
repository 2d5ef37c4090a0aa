"""The family matrix over real configurations: every `configurations` entry of every registered
spec (the switch settings of its published checkpoints: q/k norms on and off, parallel residual
on and off, tied and untied embeddings, biases, partial rotary, rotary scaling, sliding windows,
MHA/GQA/MQA) and every rotary scaling kind in ROPE_TYPES on every family whose rotary comes from
the model's rotary module, each on a tiny random fp32 checkpoint built from the spec's `tiny`
config plus the overrides. The checks are test_families.py's, through the model's own modules.
Unsupported switches are refused at load with one sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoConfig

import tests.unit.test_families as checks
from model_worker.analysis.flow import flow_masks, information_flow, layer_masses, pair_counts
from model_worker.analysis.scores import masked
from model_worker.common.errors import UnsupportedModelError
from model_worker.model.adapters import REGISTRY
from model_worker.model.adapters.spec import ROPE_TYPES, FamilySpec
from model_worker.model.architectures import adapter_for
from model_worker.model.capture import run_with_cache
from model_worker.model.loading import LoadedModel
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

CONFIGURATIONS = [
    (family, name, overrides)
    for family, spec in sorted(REGISTRY.items())
    for name, overrides in spec.configurations
]


def test_every_family_states_the_configurations_it_was_verified_on() -> None:
    for spec in REGISTRY.values():
        assert spec.configurations, f"{spec.family} lists no verified configuration"
        assert spec.configurations[0][1] == {}, "the first configuration is the tiny one itself"
        assert spec.catalog()["verified"]["configurations"][0]["name"] == spec.configurations[0][0]


@pytest.fixture(
    scope="module",
    params=CONFIGURATIONS,
    ids=[f"{family}-{name}" for family, name, _ in CONFIGURATIONS],
)
def configured(request: pytest.FixtureRequest) -> LoadedModel:
    family, _, overrides = request.param
    loaded = tiny_family(family, overrides=overrides)
    config = loaded.model.config
    settings = {**config.to_dict(), **config.to_dict().get("rope_parameters", {})}
    for key, value in overrides.items():  # each switch really is set (rotary shares move into
        if key in ("rotary_pct", "partial_rotary_factor"):  # rope_parameters, renamed)
            key = "partial_rotary_factor"
        assert settings[key] == value, key
    return loaded


def test_heads_plus_bias_equal_what_attention_adds(configured: LoadedModel) -> None:
    checks.test_heads_plus_bias_equal_what_attention_adds(configured)


def test_residual_bookkeeping_and_embeddings(configured: LoadedModel) -> None:
    checks.test_residual_bookkeeping_and_embeddings(configured)


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_head_increases_equal_a_direct_computation(configured: LoadedModel, mode: str) -> None:
    checks.test_head_increases_equal_a_direct_computation(configured, mode)


def test_zeroing_a_head_equals_removing_its_slice(configured: LoadedModel) -> None:
    checks.test_zeroing_a_head_equals_removing_its_slice(configured)


def test_adapter_attention_is_the_models(configured: LoadedModel) -> None:
    """q/k norms as configured, partial rotary, scaling, windows: the recomputed pattern, the
    recorded scores and the position-free heads all match the model."""
    checks.test_adapter_queries_and_keys_reproduce_the_models_attention(configured)
    checks.test_recorded_queries_and_keys_are_what_the_model_scores_with(configured)
    checks.test_positionless_heads_are_the_models_attention_without_positions(configured)


def test_the_declared_block_shape_is_the_models(configured: LoadedModel) -> None:
    checks.test_the_declared_block_shape_is_the_models(configured)


def test_analyze_equals_the_batched_experiments(configured: LoadedModel) -> None:
    """The whole analysis (narrowed capture, details) runs on every configuration and its head
    increases equal the experiments' batched ones (an independent capture)."""
    checks.test_batched_experiment_increases_equal_analyze(configured)


def switch_flags(spec: FamilySpec) -> list[str]:
    """The config flags that decide a spec's structure: its q/k norms' and parallel residual's."""
    flags = [spec.qk_norm_flag, spec.parallel if isinstance(spec.parallel, str) else None]
    return [flag for flag in flags if flag is not None]


SWITCHED = [
    (family, flag) for family, spec in sorted(REGISTRY.items()) for flag in switch_flags(spec)
]


@pytest.mark.parametrize(("family", "flag"), SWITCHED, ids=[f"{f}-{k}" for f, k in SWITCHED])
def test_the_matrix_covers_both_values_of_every_structural_flag(family: str, flag: str) -> None:
    """Each flag that switches a family's structure (q/k norms, parallel residual) is built
    both ways by the matrix, and the built model really has (or lacks) what it switches: the
    q/k norm modules in every layer, the parallel block (see the declared block shape test).
    A config's keyword a model class ignores would otherwise leave one side never tested."""
    spec = REGISTRY[family]
    seen: dict[bool, str] = {}
    for name, overrides in spec.configurations:
        loaded = tiny_family(family, overrides=overrides)
        value = bool(getattr(loaded.model.config, flag))
        seen.setdefault(value, name)
        adapter, model = loaded.adapter, loaded.model
        if flag == spec.qk_norm_flag:
            assert adapter.qk_norm == value, name
            for layer in range(loaded.geometry.n_layers):
                for path in (spec.q_norm, spec.k_norm):
                    assert path is not None
                    present = isinstance(getattr_path(adapter.layer(model, layer), path), nn.Module)
                    assert present == value, f"{name}: layer {layer} {path} present={present}"
        else:
            assert adapter.parallel == value, name
    assert set(seen) == {False, True}, f"{family}: {flag} only ever {set(seen)} in {seen}"


def getattr_path(module: nn.Module, path: str) -> object:
    """The attribute at dotted `path` under `module`, None where any step is missing."""
    found: object = module
    for part in path.split("."):
        found = getattr(found, part, None)
    return found


def rope_parameters(loaded: LoadedModel, rope_type: str) -> dict[str, Any]:
    """Rope parameters of `rope_type` for a tiny checkpoint (original window 8 of 64 positions,
    so the 13-token prompt runs past it: longrope switches to its long factors)."""
    half = loaded.adapter.rotary_dims(loaded.model, 0, loaded.geometry) // 2
    common: dict[str, Any] = {"rope_type": rope_type, "rope_theta": 10000.0}
    extra: dict[str, dict[str, Any]] = {
        "default": {},
        "linear": {"factor": 2.0},
        "dynamic": {"factor": 2.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 8},
        "longrope": {
            "short_factor": [1.0 + i / 10 for i in range(half)],
            "long_factor": [2.0 + i for i in range(half)],
            "original_max_position_embeddings": 8,
        },
        "llama3": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    }
    return {**common, **extra[rope_type]}


def rope_overrides(family: str, rope_type: str) -> dict[str, Any]:
    """Config overrides giving the family's tiny checkpoint `rope_type` (Gemma 3: on each of
    its layer kinds; partial rotary kept)."""
    plain = tiny_family(family)
    parameters = rope_parameters(plain, rope_type)
    partial = plain.model.config.rope_parameters
    if all(isinstance(v, Mapping) for v in partial.values()):  # Gemma 3: one per layer kind
        parameters = {kind: {**value, **parameters} for kind, value in partial.items()}
    elif "partial_rotary_factor" in partial:
        parameters["partial_rotary_factor"] = partial["partial_rotary_factor"]
    overrides: dict[str, Any] = {"rope_parameters": parameters}
    if getattr(plain.model.config, "head_dim", 0) is None:  # transformers' dynamic rope reads it
        overrides["head_dim"] = plain.geometry.d_head
    return overrides


def accepted(family: str, rope_type: str) -> bool:
    """Whether transformers' config of `family` accepts `rope_type` at all (Phi-3's takes
    only longrope): the kinds a real checkpoint of it can have."""
    try:
        AutoConfig.for_model(
            family, **{**REGISTRY[family].tiny, **rope_overrides(family, rope_type)}
        )
    except Exception:  # transformers' config validation raises several types
        return False
    return True


ROTARY = sorted(f for f, spec in REGISTRY.items() if spec.rotary == "rotate_half")
ROPE_CASES = [
    (family, kind) for family in ROTARY for kind in REGISTRY[family].rope_types if kind != "default"
]


@pytest.mark.parametrize("family", ROTARY)
def test_each_spec_lists_the_rotary_kinds_its_config_accepts(family: str) -> None:
    """What the catalog says was verified is what the family's config can carry."""
    assert [k for k in ROPE_TYPES if accepted(family, k)] == list(REGISTRY[family].rope_types)


@pytest.mark.parametrize(("family", "rope_type"), ROPE_CASES)
def test_every_rotary_scaling_kind_is_the_models(family: str, rope_type: str) -> None:
    """Scaled rotaries (cos² + sin² ≠ 1 for YaRN and longrope) rotate and un-rotate exactly."""
    loaded = tiny_family(family, overrides=rope_overrides(family, rope_type))
    checks.test_adapter_queries_and_keys_reproduce_the_models_attention(loaded)
    checks.test_recorded_queries_and_keys_are_what_the_model_scores_with(loaded)


def refused(family: str, **switches: Any) -> str:
    """The one-sentence refusal of the family's tiny config with `switches` set on it."""
    config = tiny_family(family).model.config
    for key, value in switches.items():
        setattr(config, key, value)
    with pytest.raises(UnsupportedModelError) as error:
        adapter_for(config)
    message = str(error.value)
    assert "\n" not in message and message.count(". ") == 0
    return message


def test_unsupported_switches_are_refused_at_load_in_one_sentence() -> None:
    assert "quantised (gptq)" in refused("llama", quantization_config={"quant_method": "gptq"})
    odd_rope = {"rope_type": "proportional", "rope_theta": 10000.0}
    assert "'proportional' is not verified" in refused("qwen3", rope_parameters=odd_rope)
    layers = ["full_attention", "linear_attention", "full_attention"]
    assert "'linear_attention'" in refused("qwen2", layer_types=layers)
    message = refused("gemma3_text", use_bidirectional_attention=True)
    assert "use_bidirectional_attention=True is not supported" in message


def test_fp16_masks_exclude_what_the_window_excludes() -> None:
    """An fp16 model's additive mask bottoms at −65504, not float32's minimum: the recorded
    mask keeps the model's dtype, so the positions outside a sliding window are excluded."""
    loaded = tiny_family("mistral", dtype=torch.float16)
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids, record_qk=True)
    assert cache.qk is not None and cache.qk[0].mask is not None
    mask, last = cache.qk[0].mask, ids.shape[1] - 1
    assert mask.dtype == torch.float16
    window = loaded.adapter.sliding_window(loaded.model, 0)
    assert window is not None and window < last
    excluded = masked(mask[0, 0, last], last + 1)
    assert excluded.tolist() == [last - p >= window for p in range(last + 1)]
    outside = cache.pattern[0, 0, :, last, : last + 1][:, excluded]
    assert outside.numel() and torch.equal(outside, torch.zeros_like(outside))


@pytest.mark.parametrize("labels", [[], [3], [2, 5, 9], [0, 4, 11]])
def test_flow_masses_without_pair_sets_equal_the_pair_set_sums(labels: list[int]) -> None:
    """layer_masses (what a capture keeps per layer) = the sums over flow_masks' pair sets."""
    torch.manual_seed(len(labels))
    pattern = torch.rand(2, 3, 12, 12).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    masks = flow_masks(12, labels)
    assert pair_counts(12, labels) == {name: int(mask.sum()) for name, mask in masks.items()}
    for layer in range(2):
        averaged = pattern[layer].mean(0)
        expected = torch.stack([(averaged * mask).sum() for mask in masks.values()])
        assert torch.allclose(layer_masses(averaged, labels), expected, atol=1e-5)
    flow = information_flow(pattern, labels)
    assert torch.allclose(sum(flow.mass.values()), torch.full((2,), 12.0), atol=1e-5)
