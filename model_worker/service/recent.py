"""The last few analyses a worker computed, so that a request for more of one of them (a head
detailed later, its label-key tables, its score decomposition: the head panel's on-demand
requests, `AnalysisRequest.extra_heads`, `towers`, `label_keys`) costs one forward pass and
those heads' details (`model_worker.run.more_heads.detail_more`), not a whole analysis.

Keyed by the loaded model (the object itself: tests' models share an empty fingerprint) and
the request without its detail options, which the per-head stage does not depend on; a worker
that did not compute the analysis (another worker of a lab server, or a restarted one) misses
and analyses as before.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple

from model_worker.contracts.analysis import AnalysisRequest, AnalysisResult
from model_worker.model.loading import LoadedModel

#: How many analyses a worker keeps (each a few MB of Python objects at 512 tokens).
KEPT = 4

#: The request fields that only choose which heads are detailed and how (and the model's
#: name: a stored request may name the served model or not).
DETAIL_OPTIONS: dict[str, object] = {
    "model": None,
    "extra_heads": [],
    "towers": [],
    "towers_position": None,
    "towers_versus": None,
    "label_keys": [],
}


class Kept(NamedTuple):
    model: weakref.ref[LoadedModel]
    result: AnalysisResult


class RecentAnalyses:
    """The `size` most recently computed analyses, by model and request less its detail
    options."""

    def __init__(self, size: int = KEPT) -> None:
        self._size = size
        self._kept: OrderedDict[tuple[int, str], Kept] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(loaded: LoadedModel, request: AnalysisRequest) -> tuple[int, str]:
        return id(loaded), request.model_copy(update=DETAIL_OPTIONS).model_dump_json()

    def get(self, loaded: LoadedModel, request: AnalysisRequest) -> AnalysisResult | None:
        """The kept analysis of `request`'s prompt and options (any detail options), or None."""
        key = self._key(loaded, request)
        with self._lock:
            found = self._kept.get(key)
            if found is None or found.model() is not loaded:  # another model at the same id
                return None
            self._kept.move_to_end(key)
            return found.result

    def put(self, loaded: LoadedModel, request: AnalysisRequest, result: AnalysisResult) -> None:
        """Keep `result` (of `request`), dropping the least recently used beyond the size."""
        key = self._key(loaded, request)
        with self._lock:
            self._kept[key] = Kept(weakref.ref(loaded), result)
            self._kept.move_to_end(key)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


#: This worker process's recent analyses.
RECENT = RecentAnalyses()
