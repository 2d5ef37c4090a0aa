"""Readable terminal tables of an AnalysisResult (rich)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from model_worker.common.token_quote import quoted
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.common import TopTokens

#: the width of tables printed to a pipe or a file: as wide as they need, never cut at 80
PIPED_WIDTH = 1000


def output_console() -> Console:
    """A console at the terminal's width, or, piped, one where no table is cut or wrapped."""
    return Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)


def _signed(value: float | None) -> str:
    """+0.123, or … for a value still being computed."""
    return "…" if value is None else f"{value:+.3f}"


def print_result(result: AnalysisResult, console: Console | None = None, heads: int = 10) -> None:
    """Target, labels, layer increases, the top heads and the top head's token tables."""
    console = console or output_console()
    target = result.target
    console.print(
        f"[bold]{result.model}[/]  target {escape(quoted(target.token))} ({target.source}), "
        f"p = {target.prob:.3f}, norm = {result.norm}"
    )
    answer = result.answer
    if answer is not None:
        verdict = "right" if answer.correct else "wrong"
        console.print(
            f"prediction {answer.predicted_token!r} is {verdict}: expected "
            f"{answer.expected_token!r} (p = {answer.expected_prob:.3f}, {answer.source})",
            highlight=False,
        )
    if result.labels:
        marks = ", ".join(
            f"{label.position}:{label.word}{'✓' if label.is_true else '✗'}"
            for label in result.labels
        )
        console.print(f"labels (position:word, ✓ true): {marks}")
    else:
        console.print("no ICL structure detected: the label columns are left out")
    for note in result.notes:
        console.print(f"[dim]note:[/] {escape(note)}", highlight=False)
    for warning in result.warnings:
        console.print(f"[yellow]warning ({warning.code}):[/] {escape(warning.message)}")

    layers = Table(title="Log-probability increase per layer (paper Fig. 2)")
    for column in ("layer", "attention", "FFN"):
        layers.add_column(column, justify="right")
    for row in result.layers:
        layers.add_row(str(row.layer), f"{row.attn_increase:+.3f}", f"{row.ffn_increase:+.3f}")
    console.print(layers)

    by = "label increase" if result.rank_by == "label" else "increase"
    top = Table(title=f"Top {heads} heads by {by} (in-context heads)")
    labelled = bool(result.labels)  # without labels, their columns would only say 0
    columns = ("rank", "head", "increase")
    columns += ("label", "other", "attn true", "attn false", "MRR") if labelled else ()
    for column in columns:
        top.add_column(column, justify="right")
    for summary in result.heads[:heads]:
        detail = result.head_details.get(summary.name)
        mrr = (
            ", ".join(f"{m.label.strip()}={m.mrr:.3f}" for m in detail.value_mrr) if detail else ""
        )
        cells = [str(summary.rank), summary.name, f"{summary.increase:+.3f}"]
        if labelled:
            cells += [
                _signed(summary.label_increase),
                _signed(summary.other_increase),
                f"{summary.attn_true:.3f}",
                f"{summary.attn_false:.3f}",
                mrr,
            ]
        top.add_row(*cells)
    console.print(top)

    if result.top_heads:
        detail = result.head_details[result.top_heads[0]]
        tokens = Table(title=f"{detail.name}: vocabulary projections (paper Table 1)")
        tokens.add_column("view")
        tokens.add_column("top tokens")
        for value in detail.values:
            tokens.add_row(f"{value.position}-value", _words(value.value))
        for key in detail.keys or []:  # None: not computed (label_keys)
            tokens.add_row(f"{key.position}-key", _words(key.normalized_input))
        tokens.add_row(f"{len(result.tokens) - 1}-query", _words(detail.query))
        console.print(tokens)


def _words(tops: TopTokens) -> str:
    return escape(", ".join(quoted(token.strip()) for token in tops.tokens[:8]))
