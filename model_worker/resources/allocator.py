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
    return done
