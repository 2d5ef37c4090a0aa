"""The registry of model families: every module in `families/` with a `SPEC` (torch-free).

Adding a family is one file, `model_worker/model/adapters/families/<model_type>.py`; the test matrix
(tests/unit/test_families.py) is built from this registry, and every spec carries the tiny
config its tests build, so a family cannot be registered untested.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from model_worker.common.errors import UnsupportedModelError
from model_worker.model.adapters import families
from model_worker.model.adapters.spec import FamilySpec

#: A config key by which an unregistered model_type declares itself a registered structure,
#: e.g. `"icl_heads_family": "llama"` in a Llama clone's config.json. Never guessed.
DECLARED_FAMILY_KEY = "icl_heads_family"


def _discover() -> dict[str, FamilySpec]:
    found: dict[str, FamilySpec] = {}
    for info in sorted(pkgutil.iter_modules(families.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        spec = importlib.import_module(f"{families.__name__}.{info.name}").SPEC
        if not isinstance(spec, FamilySpec) or spec.family != info.name:
            raise TypeError(f"families/{info.name}.py must define SPEC for {info.name!r}")
        found[spec.family] = spec
    return found


REGISTRY: dict[str, FamilySpec] = _discover()


def supported() -> str:
    """The supported model types, comma-separated."""
    return ", ".join(REGISTRY)


def spec_for(model_type: str, config: Any = None) -> FamilySpec:
    """The spec of `model_type`; an unregistered type only when `config` declares a registered
    family under DECLARED_FAMILY_KEY. Raises UnsupportedModelError with one line otherwise."""
    if model_type in REGISTRY:
        return REGISTRY[model_type]
    declared = getattr(config, DECLARED_FAMILY_KEY, None)
    if isinstance(declared, str) and declared in REGISTRY:
        return REGISTRY[declared]
    hint = f" (its config declares {DECLARED_FAMILY_KEY}={declared!r})" if declared else ""
    raise UnsupportedModelError(
        f"unsupported model_type {model_type!r}{hint}; supported: {supported()}"
    )


def catalog() -> list[dict[str, Any]]:
    """Every family as plain JSON (CLI `icl-heads models`, GET /api/families)."""
    return [spec.catalog() for spec in REGISTRY.values()]
