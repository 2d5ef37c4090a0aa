"""Ranks, reciprocal ranks and top-k token lists of vocabulary projections."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from model_worker.resources.device_branches import host_bound

#: Bytes of logits one projection block holds. On the CPU a block stays under glibc's largest
#: mmap threshold (32 MiB) so that malloc recycles it; a larger one is mapped afresh and
#: page-faulted in by every pass over it (logsumexp, ranks), which then cost as much as the
#: matmul itself. 30 MiB is 160 rows of SmolLM2's 49,152 logits, near the matmul's best.
CPU_BLOCK_BYTES = 30 * 2**20
GPU_BLOCK_BYTES = 512 * 2**20


def block_rows(vocab: int, device: torch.device) -> int:
    """How many vectors of a `vocab`-sized projection make one block on `device`."""
    budget = CPU_BLOCK_BYTES if device.type == "cpu" else GPU_BLOCK_BYTES
    return min(4096, max(8, budget // (4 * vocab)))


def logsumexp_(x: Tensor) -> Tensor:
    """logsumexp over the last axis, overwriting `x` with scratch (no temporary as big as x)."""
    peak = x.amax(-1, keepdim=True)
    return x.sub_(peak).exp_().sum(-1).log_().add_(peak.squeeze(-1))


#: Width of the vocabulary blocks `top_k` takes its candidates from (measured best for 49,152
#: logits a row: ~5× faster than `Tensor.topk` over the whole row on a 2-core CPU).
TOP_K_BLOCK = 64


def top_k(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest of `logits` [N, V] per row, largest first, and their indices: the same
    values as `logits.topk(k)`. Candidates are the k blocks of TOP_K_BLOCK logits with the
    largest maxima, plus any tail: every logit outside them is at most the k-th of those maxima,
    which are k distinct candidates, so the candidates hold the top k."""
    n, vocab = logits.shape
    width = TOP_K_BLOCK
    whole = vocab // width * width
    if whole // width <= k:
        top = logits.topk(min(k, vocab), dim=-1)
        return top.values, top.indices
    blocks = logits[:, :whole].reshape(n, whole // width, width)
    chosen = blocks.amax(-1).topk(k, dim=-1).indices  # [N, k]
    offsets = torch.arange(width, device=logits.device)
    index = (chosen[..., None] * width + offsets).reshape(n, k * width)
    if whole < vocab:
        tail = torch.arange(whole, vocab, device=logits.device).expand(n, -1)
        index = torch.cat([index, tail], 1)
    values, picked = logits.gather(1, index).topk(k, dim=-1)
    return values, index.gather(1, picked)


#: Bytes of comparisons `rank_of` writes at a time: a scratch block that stays in a core's L2
#: cache while it is summed (the whole block's comparisons, as big as its logits, were written
#: out to memory and read back).
RANK_SCRATCH_BYTES = 2**20


def rank_of(logits: Tensor, reference: Tensor) -> Tensor:
    """1-based rank [...] of `reference` [..., 1] among `logits` [..., V]: 1 + how many logits
    exceed it. The comparison writes 0.0/1.0 as fp32 and sums those: an fp32 sum of zeros and
    ones is exact below 2²⁴ terms (any vocabulary) and vectorises, where a comparison into
    booleans and their integer sum took ~5× longer on the CPU (7.4 vs 1.4 ms for 62 × 49,152
    logits, one thread; the largest item outside the products at 512 tokens). Rows go a few at
    a time through one scratch block of RANK_SCRATCH_BYTES. Elsewhere (a GPU, where each
    chunk would be two more launches) one comparison and one int32 sum."""
    if host_bound(logits.device):
        return rank_at_once(logits, reference)
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat, flat_reference = logits.reshape(-1, vocab), reference.reshape(-1, 1)
    n = flat.shape[0]
    counts = torch.empty(n, dtype=torch.float32, device=logits.device)
    step = max(1, min(n, RANK_SCRATCH_BYTES // (4 * vocab)))
    scratch = torch.empty(step, vocab, dtype=torch.float32, device=logits.device)
    for start in range(0, n, step):
        stop = min(n, start + step)
        hits = torch.gt(flat[start:stop], flat_reference[start:stop], out=scratch[: stop - start])
        torch.sum(hits, -1, out=counts[start:stop])
    return counts.long().reshape(lead) + 1


def rank_at_once(logits: Tensor, reference: Tensor) -> Tensor:
    """`rank_of` as a GPU computes it: one comparison and one int32 sum over all rows."""
    return (logits > reference).sum(-1, dtype=torch.int32).long() + 1


def mean_reciprocal_rank(ranks: list[int]) -> float:
    """Mean of 1/rank; 0.0 for no ranks."""
    return sum(1.0 / r for r in ranks) / len(ranks) if ranks else 0.0


@dataclass(frozen=True)
class VocabSummary:
    """Top-k ids/values [N, k] of N projected vectors, and label ranks [N] where asked for."""

    top_ids: Tensor
    top_values: Tensor
    ranks: Tensor

    def rows(self, start: int, stop: int) -> VocabSummary:
        return VocabSummary(
            self.top_ids[start:stop], self.top_values[start:stop], self.ranks[start:stop]
        )

    @cached_property
    def top_lists(self) -> tuple[list[Any], list[Any]]:
        """top_ids and top_values as nested Python lists, converted once: reading a summary's
        thousands of top-token lists from them is ~10× cheaper than a tensor index each."""
        return self.top_ids.tolist(), self.top_values.tolist()

    @cached_property
    def rank_lists(self) -> list[Any]:
        """ranks as (nested) Python lists, converted once, as `top_lists`."""
        return self.ranks.tolist()

    def reshaped(self, shape: tuple[int, ...]) -> VocabSummary:
        """Rows [N] laid out as `shape` (N = prod(shape)), where they are (`on_host` moves
        many summaries to the CPU at once)."""
        width = self.top_ids.shape[-1]
        return VocabSummary(
            self.top_ids.reshape(*shape, width),
            self.top_values.reshape(*shape, width),
            self.ranks.reshape(shape),
        )


def on_host(
    summaries: list[VocabSummary], tensors: list[Tensor], pack: bool = False
) -> tuple[list[VocabSummary], list[Tensor]]:
    """`summaries` and fp32 `tensors` on the CPU, in one device→host transfer (each tensor's
    own `.cpu()` or `.tolist()` is a synchronised copy; a details stage has dozens): packed as
    int32 words (token ids and ranks < 2³¹, fp32 values bit for bit), copied once, unpacked.
    On the CPU already: returned as they are, unless `pack` (to test the packing there)."""
    every = [t for s in summaries for t in (s.top_ids, s.top_values, s.ranks)] + tensors
    off_cpu = [t.device for t in every if t.device.type != "cpu"]
    if not off_cpu and not pack:
        return summaries, tensors
    device = off_cpu[0] if off_cpu else torch.device("cpu")

    def words(t: Tensor) -> Tensor:
        flat = t.to(device).flatten()
        return flat.float().view(torch.int32) if t.is_floating_point() else flat.int()

    packed = torch.cat([words(t) for t in every]).cpu()
    moved, start = [], 0
    for t in every:
        part = packed[start : start + t.numel()].view(t.shape)
        moved.append(part.view(torch.float32) if t.is_floating_point() else part)
        start += t.numel()
    out = [VocabSummary(*moved[3 * i : 3 * i + 3]) for i in range(len(summaries))]
    return out, moved[3 * len(summaries) :]


def summarize_logits(logits: Tensor, k: int, rank_ids: Tensor) -> VocabSummary:
    """Top-k of `logits` [N, V] and the 1-based rank of `rank_ids` [N] (−1 entries: rank 0)."""
    top_values, top_ids = top_k(logits, k)
    rank_ids = rank_ids.to(logits.device)  # label ids come from the CPU (the model's: CUDA)
    ranks = torch.zeros_like(rank_ids)
    wanted = (rank_ids >= 0).nonzero().squeeze(-1)
    if len(wanted):  # counting over the vocabulary only for the rows that ask for a rank
        rows = logits if len(wanted) == len(rank_ids) else logits[wanted]
        reference = rows.gather(-1, rank_ids[wanted, None])
        ranks[wanted] = rank_of(rows, reference)
    return VocabSummary(top_ids, top_values, ranks)


def concat(summaries: list[VocabSummary]) -> VocabSummary:
    """The summaries of consecutive chunks as one."""
    return VocabSummary(
        torch.cat([s.top_ids for s in summaries]),
        torch.cat([s.top_values for s in summaries]),
        torch.cat([s.ranks for s in summaries]),
    )


def summarize_projections(
    project: Callable[[Tensor], Tensor],
    vectors: Tensor,
    k: int,
    rank_ids: Tensor,
    chunk: int,
) -> VocabSummary:
    """Project `vectors` [N, D] through `project` `chunk` rows at a time (one pass over the
    unembedding per chunk), keeping the top k tokens and the rank of `rank_ids` [N]."""
    if vectors.shape[0] == 0:
        empty = torch.zeros(0, k, dtype=torch.long, device=vectors.device)
        return VocabSummary(empty, empty.float(), empty[:, 0])
    return concat(
        [
            summarize_logits(
                project(vectors[start : start + chunk]), k, rank_ids[start : start + chunk]
            )
            for start in range(0, vectors.shape[0], chunk)
        ]
    )
