"""glibc's allocator told to keep the memory an analysis frees, for the next one to reuse.

An analysis allocates and frees hundreds of MB in blocks of logits (each under 30 MiB). By
default glibc hands the freed top of its heaps back to the kernel (M_TRIM_THRESHOLD, adjusted
up to 64 MiB), so the next analysis page-faults the same memory in afresh: ~20,000–36,000 minor
faults an analysis on SmolLM2, its per-head stage and whole analysis ~15% slower (measured here;
docs/performance.md, "Measurement log"). Keeping up to KEEP_FREED_BYTES of it costs no peak
memory: the process simply stays at its peak between jobs. Where the user tunes malloc themselves
(MALLOC_* or GLIBC_TUNABLES in the environment), or the C library is not glibc, nothing is
changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

#: mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Freed memory kept at the top of a heap before any is returned to the kernel.
KEEP_FREED_BYTES = 1 << 30
#: Blocks below this come from the heaps (reused) rather than from mmap (faulted in afresh):
#: glibc's largest allowed value on 64-bit systems, above the 30 MiB blocks of logits.
MMAP_THRESHOLD_BYTES = 32 << 20

_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
#: From this many tokens on, an analysis's blocks of 8 MiB and more come from mmap (given back
#: at their free) rather than from the heaps: a long prompt's U_h (12 MiB a head on SmolLM2),
#: kept across prompts, and its 30 MiB blocks of logits interleave in the heap, whose freed
#: holes then stay resident (heap 822 MiB for 651 in use at the end of a 1,022-token analysis,
#: peak RSS 1.81 GiB; with this 1.71 GiB, measured here). Short prompts, whose analysis is a
#: few blocks, keep every block in the heaps (no page faults).
LONG_PROMPT_TOKENS = 512
LONG_PROMPT_MMAP_BYTES = 8 << 20
_tuned = False  # whether keep_freed_memory set our thresholds (else nothing is changed)


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds for this process; whether they were set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _ENVIRONMENT):
        return False
    libc = ctypes.CDLL(None)
    done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    )
    if not done:
        log.warning("glibc refused the malloc thresholds; freed memory is returned as usual")
    global _tuned
    _tuned = done
    return done


def fit_prompt(tokens: int) -> int | None:
    """Set the mmap threshold for an analysis of `tokens` tokens (LONG_PROMPT_MMAP_BYTES from
    LONG_PROMPT_TOKENS on, else MMAP_THRESHOLD_BYTES); returns it, or None where
    `keep_freed_memory` did not set the thresholds (a user's own settings, not glibc)."""
    if not _tuned:
        return None
    threshold = LONG_PROMPT_MMAP_BYTES if tokens >= LONG_PROMPT_TOKENS else MMAP_THRESHOLD_BYTES
    ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold)
    return threshold
