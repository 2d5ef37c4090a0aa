"""ICL Heads Explorer in one import: analyse prompts locally or on a lab server, in a notebook.

Local (loads torch and the model on first use)::

    import icl_heads
    model = icl_heads.load_model()                   # SmolLM2-135M by default
    result = icl_heads.analyze(model, "love : bar like : bar eight : foo two : foo one :")
    result                                           # heatmap, layer chart, top heads
    result.head("L23H1")                             # one head's panel
    result.heads_frame()                             # pandas (the `notebook` extra)
    icl_heads.towers(model, prompt, head="L23H1")    # why it attends there (docs/towers.md)

On a shared server (no torch needed)::

    client = icl_heads.Client("http://gpu-box:8000", token="…")
    result = client.analyze("love : bar like : bar eight : foo two : foo one :")

Names are imported on first access: `import icl_heads` and `icl_heads.Client` never import
torch; `load_model`, `analyze` and `run_experiment` do. Their results (and the client's) are
`icl_heads.results`' models: the engine's contracts plus the dashboard's figures
(`_repr_html_`) and pandas tables.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icl_heads.client import (
        AuthError as AuthError,
    )
    from icl_heads.client import (
        Client as Client,
    )
    from icl_heads.client import (
        ClientError as ClientError,
    )
    from icl_heads.client import (
        InvalidRequest as InvalidRequest,
    )
    from icl_heads.client import (
        JobFailed as JobFailed,
    )
    from icl_heads.client import (
        NotFound as NotFound,
    )
    from icl_heads.client import (
        ServerUnavailable as ServerUnavailable,
    )
    from icl_heads.local import analyze as analyze
    from icl_heads.local import load_model as load_model
    from icl_heads.local import run_experiment as run_experiment
    from icl_heads.patching import patch as patch
    from icl_heads.results import (
        AnalysisResult as AnalysisResult,
    )
    from icl_heads.results import (
        ExperimentResult as ExperimentResult,
    )
    from icl_heads.results import (
        Head as Head,
    )
    from model_worker.contracts.analysis import AnalysisRequest as AnalysisRequest
    from model_worker.contracts.analysis import HeadDetail as HeadDetail
    from model_worker.contracts.analysis import HeadSummary as HeadSummary
    from model_worker.contracts.experiments import ExperimentRequest as ExperimentRequest
    from model_worker.contracts.patching import PatchingResult as PatchingResult
    from model_worker.contracts.patching import PatchRequest as PatchRequest
    from model_worker.contracts.towers import Towers as Towers
    from model_worker.model.loading import LoadedModel as LoadedModel
    from model_worker.towers.run import towers as towers

#: Public name → the module that defines it.
_EXPORTS = {
    "load_model": "icl_heads.local",
    "LoadedModel": "model_worker.model.loading",
    "analyze": "icl_heads.local",
    "run_experiment": "icl_heads.local",
    "patch": "icl_heads.patching",
    "PatchRequest": "model_worker.contracts.patching",
    "PatchingResult": "model_worker.contracts.patching",
    "towers": "model_worker.towers.run",
    "Towers": "model_worker.contracts.towers",
    "AnalysisRequest": "model_worker.contracts.analysis",
    "AnalysisResult": "icl_heads.results",
    "ExperimentRequest": "model_worker.contracts.experiments",
    "ExperimentResult": "icl_heads.results",
    "Head": "icl_heads.results",
    "HeadDetail": "model_worker.contracts.analysis",
    "HeadSummary": "model_worker.contracts.analysis",
    "Client": "icl_heads.client",
    "ClientError": "icl_heads.client",
    "AuthError": "icl_heads.client",
    "NotFound": "icl_heads.client",
    "InvalidRequest": "icl_heads.client",
    "ServerUnavailable": "icl_heads.client",
    "JobFailed": "icl_heads.client",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (torch only for the local API)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'icl_heads' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
