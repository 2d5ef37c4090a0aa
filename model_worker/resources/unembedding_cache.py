"""The factored unembeddings U_h of recently detailed heads, kept per loaded model across
prompts (`model_worker.analysis.head_unembedding`): in-context heads recur from prompt to
prompt, so a head detailed again projects its values through U_h at a fraction of the cost."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from torch import Tensor

from model_worker.common.defaults import DEFAULT_HEAD_UNEMBEDDING_BYTES

HeadKey = tuple[int, int]
#: Heads remembered as seen once (their U_h is built the second time): the oldest go first.
MAX_SEEN = 4096


class HeadUnembeddings:
    """U_h by (layer, head), least recently used out first beyond `budget_bytes`; thread-safe.
    A head's U_h is built the second time it is detailed (`recurring`): a head detailed once
    costs what it did without them, one that recurs costs a fraction from then on."""

    def __init__(self, budget_bytes: int = DEFAULT_HEAD_UNEMBEDDING_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[HeadKey, Tensor] = OrderedDict()
        self._seen: OrderedDict[HeadKey, None] = OrderedDict()
        self._bytes = 0
        self._unit: int | None = None  # bytes of one U_h, once one was built
        self._reserved = 0  # bytes the analyses asked room for (`reserve`)
        self._lock = threading.Lock()

    def reserve(self, heads: int, unit_bytes: int, room_bytes: int) -> None:
        """Let the budget hold at least `heads` U_h of `unit_bytes` each, within `room_bytes`
        (a share of the device's free memory): an analysis details K heads plus a baseline head
        per detailed layer, and a budget smaller than that evicts and rebuilds them all every
        prompt (a 512 MiB budget holds 16 heads of a 1B model). No effect without a budget."""
        with self._lock:
            self._reserved = max(self._reserved, min(heads * unit_bytes, room_bytes))

    @property
    def limit(self) -> int:
        """The bytes kept at most: the budget, raised to what analyses reserved (0: none)."""
        return 0 if self.budget_bytes <= 0 else max(self.budget_bytes, self._reserved)

    def recurring(
        self, key: HeadKey, build: Callable[[], Tensor], *, at_first_sight: bool = False
    ) -> Tensor | None:
        """U_h of head `key` if it was detailed before, or now with `at_first_sight` (built by
        `build()` and kept, within the budget, when missing); None the first time otherwise
        (the head is noted as seen), and always with no budget."""
        if self.budget_bytes <= 0:
            return None
        with self._lock:
            first = key not in self._seen and key not in self._kept
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > MAX_SEEN:
                self._seen.popitem(last=False)
        return None if first and not at_first_sight else self.get(key, build)

    def holds(self, key: HeadKey) -> bool:
        with self._lock:
            return key in self._kept

    def get(self, key: HeadKey, build: Callable[[], Tensor]) -> Tensor:
        """U_h of head `key`, built by `build()` (and kept, within the budget) when missing."""
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        built = build()
        size = built.numel() * built.element_size()
        with self._lock:
            self._unit = size
            if key not in self._kept and size <= self.limit:
                self._kept[key] = built
                self._bytes += size
                while self._bytes > self.limit:
                    _, dropped = self._kept.popitem(last=False)
                    self._bytes -= dropped.numel() * dropped.element_size()
        return built

    def build_seen(
        self, build: Callable[[HeadKey], Tensor], should_stop: Callable[[], bool]
    ) -> list[HeadKey]:
        """Build the U_h of heads seen once and not kept, the most recently seen first, while
        `should_stop()` is false and the budget has free room (nothing kept goes for them, and
        they are the first to go later): a served worker calls this when idle, so that a head's
        second sighting already projects through U_h. Returns the heads built."""
        built: list[HeadKey] = []
        while self.limit > 0 and not should_stop():
            with self._lock:
                room = self.limit - self._bytes
                key = next((k for k in reversed(self._seen) if k not in self._kept), None)
            if key is None or (self._unit is not None and self._unit > room):
                break
            unembedding = build(key)
            size = unembedding.numel() * unembedding.element_size()
            with self._lock:
                self._unit = size
                if key in self._kept or self._bytes + size > self.limit:
                    break
                self._kept[key] = unembedding
                self._kept.move_to_end(key, last=False)
                self._bytes += size
            built.append(key)
        return built

    @property
    def nbytes(self) -> int:
        """Bytes kept now."""
        with self._lock:
            return self._bytes
