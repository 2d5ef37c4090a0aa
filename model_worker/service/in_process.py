"""The engine as the embedded backend runs it in its worker thread: load, check, analyse, run
experiments and idle work, behind one object. The library layer (`icl_heads.serving`) hands it
to the web tier's `EmbeddedBackend`, so the web tier never imports torch itself.

Torch and transformers are imported by the methods that need them, in the worker thread that
loads the model: `icl-heads serve` answers its first page while they load (issue 28)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

from model_worker.analysis.icl import label_words
from model_worker.checks.arguments import check_towers_positions
from model_worker.checks.budget import check_analysis
from model_worker.checks.budget import check_patch as check_patch_cost
from model_worker.common.errors import UserInputError
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest, AnalysisResult
from model_worker.contracts.experiments import ExperimentRequest, ExperimentResult
from model_worker.contracts.patching import PatchingResult, PatchRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from model_worker.model.loading import LoadedModel

Progress = Callable[[float, str], None]


class InProcessEngine:
    """One loaded model's engine for the embedded backend (`loader` replaces the settings'
    model, e.g. a tiny model in tests)."""

    def __init__(self, settings: Settings, loader: Callable[[], LoadedModel] | None = None):
        self._settings = settings
        self._loader = loader
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def load(self) -> LoadedModel:
        if self._loader is not None:
            return self._loader()
        from model_worker.service.jobs import load_served_model

        return load_served_model(self._settings)

    def check_analysis(self, loaded: LoadedModel, request: AnalysisRequest) -> None:
        """Raise a UserInputError or BudgetError, with the numbers, for a prompt longer than the
        limit, a head the model does not have or a request over the budget. Runs in the event
        loop's thread: it keeps a tokenizer of its own (fast tokenizers must not be shared
        across threads)."""
        from model_worker.model.prompting import (
            TokenizerOnly,
            check_length,
            parse_head_names,
            read_labels,
            token_limit,
        )

        tokenizer = self._own_tokenizer(loaded)
        n_tokens = len(tokenizer(request.prompt, add_special_tokens=True)["input_ids"])
        keyed = [] if request.label_keys == "all" else request.label_keys
        for heads in (request.extra_heads, request.towers, keyed):
            parse_head_names(heads, loaded.geometry.n_layers, loaded.geometry.n_heads)
        check_length(n_tokens, token_limit(loaded, self._settings.max_prompt_tokens))
        check_towers_positions(n_tokens, request)
        check_analysis(n_tokens, request, self._settings.max_analysis_cost)
        try:  # labels that no single token tells apart: refused now, naming their tokens
            _, words = label_words(request.prompt, request.labels)
        except UserInputError:
            return  # labels not in the prompt: the analysis says so, as a failed job
        read_labels(TokenizerOnly(tokenizer), request.prompt, [w for w, _ in words])

    def analyze(
        self,
        loaded: LoadedModel,
        request: AnalysisRequest,
        on_heads: Callable[[AnalysisResult], None],
    ) -> AnalysisResult:
        from model_worker.service.jobs import run_analysis

        return run_analysis(loaded, request, on_heads, settings=self._settings)

    def experiment(
        self,
        loaded: LoadedModel,
        request: ExperimentRequest,
        progress: Progress,
        between_slices: Callable[[], None] | None = None,
    ) -> ExperimentResult:
        """Run the experiment, calling `between_slices()` before each slice of its passes (the
        embedded backend runs waiting interactive jobs there, or stops a cancelled one)."""
        from model_worker.experiments.job import run_experiment
        from model_worker.experiments.slices import Slicer

        return run_experiment(
            loaded,
            request,
            progress,
            max_tokens=self._settings.max_prompt_tokens,
            slicer=Slicer(between_slices),
        )

    def _own_tokenizer(self, loaded: LoadedModel) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            self._tokenizer = copy.deepcopy(loaded.tokenizer)
        return self._tokenizer

    def check_patch(
        self, loaded: LoadedModel, request: PatchRequest, added: int | None = None
    ) -> None:
        """Raise a UserInputError (one sentence) for a patching request whose prompts do not
        pair (model_worker.checks.patch_pairs), a head the model does not have or a prompt over the
        limit; a BudgetError for one over the budget (ICL_MAX_PATCH_COST; `added`: the request
        adds that many heads to a finished patch, and only they are priced). Runs in the event
        loop's thread, on the tokenizer copy of `check_analysis`."""
        from model_worker.checks.patch_pairs import check_heads, check_pair
        from model_worker.model.prompting import check_length, token_limit

        tokenizer = self._own_tokenizer(loaded)
        limit = token_limit(loaded, self._settings.max_prompt_tokens)
        check_heads(request, loaded.geometry.n_layers, loaded.geometry.n_heads)

        def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
            found = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
            check_length(len(found["input_ids"]), limit)
            return found["input_ids"], [(int(a), int(b)) for a, b in found["offset_mapping"]]

        check_pair(request, encode)
        n_tokens = len(tokenizer(request.prompt, add_special_tokens=True)["input_ids"])
        g = loaded.geometry
        most = self._settings.max_patch_cost
        check_patch_cost(request, n_tokens, g.n_layers, g.n_heads, most, added)

    def patch(
        self,
        loaded: LoadedModel,
        request: PatchRequest,
        progress: Progress,
        base: PatchingResult | None = None,
    ) -> PatchingResult:
        """Patch `request` (priced again: also a stored request run again); with `base`, a
        finished patch of this model it adds heads to, only their rows."""
        from model_worker.service.jobs import run_patch

        return run_patch(loaded, request, self._settings, progress, base)

    def idle_work(self, loaded: LoadedModel, job_waiting: Callable[[], bool]) -> None:
        from model_worker.service.jobs import idle_work

        idle_work(loaded, job_waiting)

    def failure_message(self, exc: BaseException) -> str:
        from model_worker.service.jobs import failure_message

        return failure_message(exc)
