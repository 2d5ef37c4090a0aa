"""Batched forward passes over many ICL prompts, summarised at each prompt's last real token.

Prompts are RIGHT-padded with an attention mask, so every real token keeps its position (exact
for learned and rotary position embeddings) and the analysed position of a row is its last real
token. A PromptRun keeps only small per-prompt tensors ([L, H] head tables); experiments that
need more read the RunCache of each batch through an `extra` callback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from torch import Tensor

from model_worker.analysis.contributions import positions_z
from model_worker.analysis.metrics import block_rows, logsumexp_
from model_worker.analysis.projection import unembed_matmul
from model_worker.common.defaults import DEFAULT_MAX_PROMPT_TOKENS
from model_worker.datasets import IclPrompt
from model_worker.experiments.progress import ProgressFn, no_progress
from model_worker.experiments.slices import (
    HEAVY_SLICE_PROMPTS,
    SLICE_PROMPTS,
    Record,
    current_slicer,
    cut,
    merged,
)
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.prompting import LabelReading, read_prompt, target_id
from model_worker.run.state import final_projector

IncreaseMode = Literal["none", "correct", "all"]


@dataclass(frozen=True)
class Prepared:
    """A tokenized prompt: ids [S], its label positions and the true/false label token ids."""

    prompt: IclPrompt
    ids: Tensor
    label_positions: tuple[int, ...]
    label_true: tuple[bool, ...]
    true_id: int
    false_id: int

    @property
    def last(self) -> int:
        return int(self.ids.shape[0]) - 1


@dataclass(frozen=True)
class Batch:
    """Right-padded rows: input_ids and attention_mask [B, S], last real position per row [B]."""

    items: list[Prepared]
    input_ids: Tensor
    attention_mask: Tensor
    last: Tensor


@dataclass(frozen=True)
class PromptRun:
    """One prompt's outcome at its last real token.

    `correct`: the true label's token beats the false label's (argmax over the two labels);
    `correct_vocab`: the true label's token is the argmax over the whole vocabulary.
    attn_true / attn_false [L, H]: attention of the last token summed over true / false label
    positions. `increases` [L, H]: I(head | resid_pre) for the true label token, when computed;
    `label_increases` the same for each head restricted to its label positions.
    """

    item: Prepared
    true_logit: float
    false_logit: float
    correct_vocab: bool
    true_logprob: float
    attn_true: Tensor
    attn_false: Tensor
    increases: Tensor | None
    extra: Any = None
    #: [L, H]: I of each head restricted to the label positions, when computed
    label_increases: Tensor | None = None
    #: [L, H, labels]: attention of the last token on each label position, in prompt order
    #: (item.label_true says which are true)
    attn_labels: Tensor | None = None

    @property
    def correct(self) -> bool:
        return self.true_logit > self.false_logit


Intervene = Callable[[Batch], AbstractContextManager[Any]]
Extra = Callable[[Batch, RunCache], list[Any]]


def prepare(
    loaded: LoadedModel,
    prompts: Sequence[IclPrompt],
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
) -> list[Prepared]:
    """Tokenize `prompts` and find their label positions (each label word's first token that
    tells the two labels apart: where they share a first token, such as SmolLM2's " " before a
    digit, the prompt is analysed with it appended, as `analyze` does); PromptError for a prompt
    longer than the model or `max_tokens` allow."""
    label_ids: dict[tuple[str, tuple[int, ...]], int] = {}

    def label_id(text: str, label: str, reading: LabelReading) -> int:
        key = (label, reading.shared)
        if key not in label_ids:
            label_ids[key] = target_id(loaded, text, label, reading)[0]
        return label_ids[key]

    items = []
    for prompt in prompts:
        present = list(dict.fromkeys(label for _, label in prompt.demonstrations))
        read = read_prompt(
            loaded, prompt.text, present, max_tokens, [prompt.true_label, prompt.false_label]
        )
        items.append(
            Prepared(
                prompt=prompt,
                ids=read.encoded.ids,
                label_positions=read.label_positions,
                label_true=tuple(s.word == prompt.true_label for s in read.structure.labels),
                true_id=label_id(prompt.text, prompt.true_label, read.reading),
                false_id=label_id(prompt.text, prompt.false_label, read.reading),
            )
        )
    return items


def make_batches(items: Sequence[Prepared], batch_size: int, pad_id: int = 0) -> Iterator[Batch]:
    """Consecutive right-padded batches of at most `batch_size` prompts."""
    for start in range(0, len(items), batch_size):
        part = list(items[start : start + batch_size])
        width = max(int(item.ids.shape[0]) for item in part)
        input_ids = torch.full((len(part), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(part), width), dtype=torch.long)
        for row, item in enumerate(part):
            input_ids[row, : item.ids.shape[0]] = item.ids
            mask[row, : item.ids.shape[0]] = 1
        last = torch.tensor([item.last for item in part])
        yield Batch(part, input_ids, mask, last)


def forward(loaded: LoadedModel, batch: Batch, intervene: Intervene | None = None) -> RunCache:
    """One captured forward pass of `batch`, inside the intervention's hooks if any."""
    device = loaded.device
    with loaded.lock, intervene(batch) if intervene is not None else nullcontext():
        return run_with_cache(
            loaded.model,
            loaded.adapter,
            loaded.geometry,
            batch.input_ids.to(device),
            batch.attention_mask.to(device),
        )


@dataclass(frozen=True)
class LastToken:
    """What the head increases of one row need: z [L, H*d_head] (times the frozen post-norm
    scale `attn_scale`), resid_pre [L, D] and
    resid_final [D] at its last real token, and the target token."""

    z: Tensor
    resid_pre: Tensor
    resid_final: Tensor
    target: int
    z_label: Tensor | None = None


def head_increase_table(
    loaded: LoadedModel, rows: Sequence[LastToken], direct: bool | None = None
) -> Tensor:
    """I(head_{l,h} | resid_pre_l) [N, L, H] for the target of each row, as `analyze()` defines
    it (fixed norm mode), computed layer by layer for all rows at once.

    bs is linear in fixed mode: bs(z_h W_O^h) = s · z_h (W_O^h C Γ W_Uᵀ) with the row's final
    scale s, C the centring (LayerNorm) and Γ the final norm's weight. The [d_head, V] matrix
    M_{l,h} = W_O^h C Γ W_Uᵀ is built once per head and shared by all rows, so each head costs
    d_head · V multiply-adds per prompt instead of D · V. W_O is the adapter's `w_out` (any
    post-norm γ folded in); a final soft-cap applies to the summed logits.

    Building every M costs as much as d_model rows' products, so for few rows (a slice of an
    experiment's pass: 8–32 prompts) each head's write z_h W_O^h C Γ goes through W_Uᵀ
    directly (`direct`; None: whichever costs fewer multiply-adds). On SmolLM2 (one thread) the
    M matrices were ~6 s of every call, whatever its rows: a 4-prompt slice took 6–8 s.
    """
    g = loaded.geometry
    if not rows:
        return torch.zeros(0, g.n_layers, g.n_heads)
    device = rows[0].z.device
    projector = final_projector(loaded, rows[0].resid_final, "fixed")
    norm, w_u = projector.norm, projector.w_u
    z = torch.stack([r.z for r in rows])  # [N, L, H*d]
    bases = torch.stack([r.resid_pre for r in rows])  # [N, L, D]
    scale = norm.inv_scale(torch.stack([r.resid_final for r in rows]))  # [N, 1]
    targets = torch.tensor([r.target for r in rows], device=device)
    block = block_rows(projector.vocab, device)
    if direct is None:  # rows · H · D · V against H · d · D · V + rows · H · d · V
        direct = len(rows) * (g.d_model - g.d_head) < g.d_head * g.d_model
    out = torch.empty(len(rows), g.n_layers, g.n_heads)
    for layer in range(g.n_layers):
        current_slicer().pause_point()  # a layer's table: ~1/30 of a slice
        w_o = loaded.adapter.w_out(loaded.model, layer, g).to(device)  # [H, d, D]
        scaled = norm.center(w_o) * norm.weight  # [H, d, D]: W_O^h C Γ
        m_t = None
        if not direct:  # M_lᵀ per head, [H, V, d]: the weight layout of the unembedding product
            m_t = unembed_matmul(w_u, scaled.reshape(-1, w_o.shape[-1]))
            m_t = m_t.view(-1, g.n_heads, g.d_head).transpose(0, 1).contiguous()
        normed = norm.center(bases[:, layer]) * scale * norm.weight
        if norm.bias is not None:
            normed = normed + norm.bias
        base = unembed_matmul(normed, w_u, kept=True) + (
            projector.b_u if projector.b_u is not None else 0.0
        )
        capped = projector.cap(base.clone())
        base_lp = capped.gather(1, targets[:, None])[:, 0] - torch.logsumexp(capped, -1)  # [N]
        z_layer = z[:, layer].reshape(-1, g.n_heads, g.d_head) * scale[:, :, None]
        for head in range(g.n_heads):
            for start in range(0, len(rows), block):
                part = slice(start, start + block)
                if m_t is None:
                    write = z_layer[part, head] @ scaled[head]  # [n, D]
                    full = unembed_matmul(write, w_u, kept=True).add_(base[part])  # [n, V]
                else:
                    full = unembed_matmul(z_layer[part, head], m_t[head]).add_(base[part])
                full = projector.cap(full)
                target = full.gather(1, targets[part, None])[:, 0]
                logprob = target - logsumexp_(full)
                out[part, layer, head] = (logprob - base_lp[part]).cpu()
    return out


def summarize_row(batch: Batch, cache: RunCache, row: int) -> PromptRun:
    """The PromptRun of one row of a captured batch."""
    item, last = batch.items[row], int(batch.last[row])
    logits = cache.logits[row, last]
    logprobs = torch.log_softmax(logits, -1)
    pattern = cache.pattern[:, row, :, last, :]  # [L, H, S]
    true_pos = [p for p, t in zip(item.label_positions, item.label_true, strict=True) if t]
    false_pos = [p for p, t in zip(item.label_positions, item.label_true, strict=True) if not t]
    return PromptRun(
        item=item,
        true_logit=float(logits[item.true_id]),
        false_logit=float(logits[item.false_id]),
        correct_vocab=int(logits.argmax()) == item.true_id,
        true_logprob=float(logprobs[item.true_id]),
        attn_true=pattern[..., true_pos].sum(-1).cpu(),
        attn_false=pattern[..., false_pos].sum(-1).cpu(),
        increases=None,
        attn_labels=pattern[..., list(item.label_positions)].cpu(),
    )


@dataclass(frozen=True)
class PassOptions:
    """How `run_prompts` treats every prompt of a pass (`label` names the pass in progress)."""

    batch_size: int = 16
    increases: IncreaseMode = "none"
    label_increases: bool = False
    intervene: Intervene | None = None
    extra: Extra | None = None
    label: str = "prompts"

    def digest_flags(self) -> str:
        """What of these options changes a pass's records (for the slices' digest)."""
        return repr(
            (
                self.label,
                self.batch_size,
                self.increases,
                self.label_increases,
                self.intervene is None,
                self.extra is None,
            )
        )


def run_prompts(
    loaded: LoadedModel,
    items: Sequence[Prepared],
    *,
    batch_size: int = 16,
    increases: IncreaseMode = "none",
    label_increases: bool = False,
    intervene: Intervene | None = None,
    extra: Extra | None = None,
    progress: ProgressFn = no_progress,
    label: str = "prompts",
) -> list[PromptRun]:
    """Forward every prompt (batched) and summarise each at its last real token; with
    `label_increases`, the prompts that get head increases also get their label increases.

    The prompts go in slices (model_worker.experiments.slices) through the experiment's slicer:
    computed here in order, or shared with other workers; merged in prompt order."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    options = PassOptions(batch_size, increases, label_increases, intervene, extra, label)
    parts = cut(
        len(items), batch_size, SLICE_PROMPTS if increases == "none" else HEAVY_SLICE_PROMPTS
    )
    total = len(items)
    progress(0.0, f"{label}: 0/{total}")

    def compute(i: int) -> list[Record]:
        part = parts[i]
        runs = _run_part(
            loaded, items[part.start : part.stop], options, progress, part.start, total
        )
        return [to_record(run) for run in runs]

    def on_slice(i: int) -> None:
        progress(parts[i].stop / max(1, total), f"{label}: {parts[i].stop}/{total}")

    digest = pass_digest(items, options.digest_flags())
    records = merged(current_slicer().run(digest, len(parts), compute, on_slice))
    if len(records) != total:
        raise RuntimeError(f"a pass over {total} prompts came back with {len(records)}")
    return [from_record(item, record) for item, record in zip(items, records, strict=True)]


#: Prompts per slice of a pass that works on one prompt at a time (`each_prompt`): each costs
#: several forward or backward passes, so a slice of one keeps an interactive job's wait short.
EACH_PROMPT_SLICE = 1


def each_prompt(
    items: Sequence[Prepared],
    compute: Callable[[int, Prepared], Record],
    *,
    label: str,
    options: str = "",
    progress: ProgressFn = no_progress,
) -> list[Record]:
    """`compute(index, item)` for every prompt, in slices through the experiment's slicer, as
    `run_prompts` does for batched passes (an interactive job runs, a cancel stops the
    experiment, other workers help, between two slices); records in prompt order. `options`
    names whatever else the records depend on (what the pass computes must be the same when
    the experiment is replayed)."""
    digest = pass_digest(items, repr(("each prompt", label, options)))
    return each_item(
        len(items), lambda i: compute(i, items[i]), digest=digest, label=label, progress=progress
    )


def each_item(
    total: int,
    compute: Callable[[int], Record],
    *,
    digest: str,
    label: str,
    progress: ProgressFn = no_progress,
) -> list[Record]:
    """`each_prompt` over `total` items not yet tokenized (`compute(index)`), the pass named by
    `digest` (its items and options: `text_digest`)."""
    step = EACH_PROMPT_SLICE
    parts = [range(start, min(total, start + step)) for start in range(0, total, step)]
    progress(0.0, f"{label}: 0/{total}")

    def compute_slice(i: int) -> list[Record]:
        return [compute(index) for index in parts[i]]

    def on_slice(i: int) -> None:
        progress(parts[i].stop / max(1, total), f"{label}: {parts[i].stop}/{total}")

    records = merged(current_slicer().run(digest, len(parts), compute_slice, on_slice))
    if len(records) != total:
        raise RuntimeError(f"a pass over {total} prompts came back with {len(records)}")
    return records


def text_digest(texts: Sequence[str], options: str) -> str:
    """A name for a pass over prompts given as text (`pass_digest` for tokenized ones)."""
    digest = hashlib.sha256(options.encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()[:32]


#: The fields of a PromptRun kept in its Record (its prompt is known to every worker).
RECORD_FIELDS = tuple(f.name for f in fields(PromptRun) if f.name != "item")


def to_record(run: PromptRun) -> Record:
    """What a slice keeps of one prompt's run: numbers and tensors only."""
    return {name: getattr(run, name) for name in RECORD_FIELDS}


def from_record(item: Prepared, record: Record) -> PromptRun:
    """The PromptRun of `item` from its Record."""
    return PromptRun(item=item, **{name: record[name] for name in RECORD_FIELDS})


def pass_digest(items: Sequence[Prepared], options: str) -> str:
    """A name for a pass: its prompts' tokens, labels and options (a replayed experiment must
    ask for the same passes in the same order)."""
    digest = hashlib.sha256(options.encode())
    for item in items:
        digest.update(item.ids.numpy().tobytes())
        digest.update(repr((item.label_positions, item.label_true, item.true_id)).encode())
        digest.update(repr(item.false_id).encode())
    return digest.hexdigest()[:32]


def _run_part(
    loaded: LoadedModel,
    items: Sequence[Prepared],
    options: PassOptions,
    progress: ProgressFn,
    offset: int,
    total: int,
) -> list[PromptRun]:
    """`run_prompts` of one slice: `items` are prompts offset.. of `total`."""
    label, increases = options.label, options.increases
    pad_id = loaded.tokenizer.pad_token_id or 0
    g = loaded.geometry
    kv = torch.tensor([g.kv_head(h) for h in range(g.n_heads)])
    runs: list[PromptRun] = []
    wanted: dict[int, LastToken] = {}
    for batch in make_batches(items, options.batch_size, pad_id):
        cache = forward(loaded, batch, options.intervene)
        extra = options.extra
        extras = extra(batch, cache) if extra is not None else [None] * len(batch.items)
        for row in range(len(batch.items)):
            run = summarize_row(batch, cache, row)
            runs.append(run if extras[row] is None else replace(run, extra=extras[row]))
            if increases == "all" or (increases == "correct" and run.correct):
                last = int(batch.last[row])
                labels = list(run.item.label_positions)
                scale = cache.attn_scale[:, row, last]  # any post-norm scale, frozen
                wanted[len(runs) - 1] = LastToken(
                    cache.z[:, row, last] * scale,
                    cache.resid_pre[:, row, last].clone(),
                    cache.resid_final[row, last].clone(),
                    run.item.true_id,
                    positions_z(cache.v[:, row], cache.pattern[:, row, :, last], kv, labels) * scale
                    if options.label_increases
                    else None,
                )
        done = offset + len(runs)
        progress(done / max(1, total), f"{label}: {done}/{total}")
        current_slicer().pause_point()
    if wanted:
        progress(done / max(1, total), f"{label}: {done}/{total}, their head increases")
        table = head_increase_table(loaded, list(wanted.values()))
        label_table = None
        if options.label_increases:
            label_rows = [replace(r, z=r.z_label) for r in wanted.values() if r.z_label is not None]
            label_table = head_increase_table(loaded, label_rows)
        for i, index in enumerate(wanted):
            runs[index] = replace(
                runs[index],
                increases=table[i],
                label_increases=None if label_table is None else label_table[i],
            )
    return runs


def accuracy(runs: Sequence[PromptRun]) -> float:
    """Fraction of prompts whose true label beats the false one (0.0 for none)."""
    return sum(r.correct for r in runs) / len(runs) if runs else 0.0


def vocab_accuracy(runs: Sequence[PromptRun]) -> float:
    """Fraction of prompts whose true label token is the argmax over the whole vocabulary."""
    return sum(r.correct_vocab for r in runs) / len(runs) if runs else 0.0
