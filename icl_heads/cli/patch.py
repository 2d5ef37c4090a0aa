"""`icl-heads patch`: activation patching of one prompt against a corrupted one, from the shell.

The request is checked before the model loads (bad input: one `error: …` line, exit 2);
`--json` prints the PatchingResult (else a text summary); `--out DIR` writes result.json and
one CSV per table (heads, layers, positions, qkv) per direction.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from icl_heads.cli.common import DeviceOption, DTypeOption, ModelOption, quietly, user_errors
from model_worker.common.errors import UserInputError
from model_worker.common.export_text import csv_text
from model_worker.common.settings import get_settings
from model_worker.contracts.patching import (
    CORRUPTIONS,
    DIRECTIONS,
    Corruption,
    PatchingResult,
    PatchRequest,
)

DirectionChoice = Annotated[
    Literal["both", "denoising", "noising"],
    typer.Option("--direction", help="denoising, noising, or both."),
]


def _request(fields: dict[str, Any]) -> PatchRequest:
    """The request, or UserInputError with pydantic's first message (one line)."""
    from pydantic import ValidationError

    try:
        return PatchRequest.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        raise UserInputError(f"{where}: {message}" if where else message) from None


def tables(result: PatchingResult) -> dict[str, list[dict[str, Any]]]:
    """The result as flat tables, one set per direction (`denoising_heads`, …)."""
    return result.tables()


def write_outputs(result: PatchingResult, out: Path) -> list[Path]:
    """result.json and one CSV per table into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "result.json"]
    written[0].write_text(result.model_dump_json(indent=1), encoding="utf-8")
    for name, rows in tables(result).items():
        written.append(out / f"{name}.csv")
        written[-1].write_text(csv_text(rows), encoding="utf-8")
    return written


def print_summary(result: PatchingResult, top: int = 10) -> None:
    """The pair, the metric's ends, and per direction the top heads, layers and q/k/v."""
    echo = typer.echo
    echo(f"clean:     {result.prompt}")
    echo(f"corrupted: {result.corrupted_prompt}  ({CORRUPTIONS[result.corruption]})")
    echo(
        f"LD = logit[{result.target!r}] − logit[{result.other!r}]: clean "
        f"{result.logit_diff_clean:+.3f}, corrupted {result.logit_diff_corrupted:+.3f}; "
        f"log p(target) {result.logprob_clean:.3f} / {result.logprob_corrupted:.3f}"
    )
    echo("effect = (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted)")
    for d in result.directions:
        agreement = "—" if d.agreement is None else f"{d.agreement:.3f}"
        echo(f"\n{d.direction}: attribution vs exact over the exact heads: r = {agreement}")
        level = 0.0 if d.direction == "denoising" else 1.0  # the unpatched run's effect
        exact = sorted(
            (h for h in d.heads if h.exact is not None),
            key=lambda h: -abs((h.exact or 0.0) - level),
        )
        echo(f"  {'head':<8}{'exact':>9}{'attrib.':>9}{'direct':>9}")
        for h in exact[:top]:
            echo(f"  {h.name:<8}{h.exact:>9.3f}{h.attribution:>9.3f}{h.direct:>9.3f}")
        echo("  layer  attn exact  ffn exact")
        for row in d.layers:
            echo(f"  {row.layer:<6}{row.attn_exact:>11.3f}{row.mlp_exact:>11.3f}")
        for q in d.qkv:
            echo(
                f"  {q.name} {q.part} @ {q.positions}: effect {q.exact:.3f}, attention to "
                f"target labels {q.attention:.3f} (base {q.attention_base:.3f}, source "
                f"{q.attention_source:.3f})"
            )


def patch(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The clean ICL prompt.")],
    corruption: Annotated[
        Corruption,
        typer.Option(help="swap-labels, query, or prompt (with --corrupted-prompt)."),
    ] = "swap-labels",
    corrupted_prompt: Annotated[
        str | None, typer.Option("--corrupted-prompt", help="The corrupted prompt.")
    ] = None,
    model: ModelOption = None,
    target: Annotated[
        str | None, typer.Option(help="The target label (default: preferred).")
    ] = None,
    labels: Annotated[
        str | None, typer.Option(help="Comma-separated labels, e.g. foo,bar.")
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Heads patched exactly.")] = 20,
    heads: Annotated[
        str | None, typer.Option(help="Comma-separated heads patched per position, e.g. L3H1.")
    ] = None,
    qkv_heads: Annotated[
        int, typer.Option("--qkv-heads", help="In-context heads whose q, k, v are patched.")
    ] = 3,
    direction: DirectionChoice = "both",
    device: DeviceOption = "auto",
    dtype: DTypeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Write JSON and CSVs here.")] = None,
) -> None:
    """Activation patching: heads, layers, positions, and the q/k/v of the in-context heads."""
    settings = get_settings()
    with user_errors():
        request = _request(
            {
                "prompt": prompt,
                "corruption": corruption,
                "corrupted_prompt": corrupted_prompt,
                "model": model,
                "target": target,
                "labels": [x.strip() for x in labels.split(",") if x.strip()] if labels else None,
                "top_k": top_k,
                "heads": [x.strip() for x in heads.split(",") if x.strip()] if heads else [],
                "qkv_heads": qkv_heads,
                "directions": list(DIRECTIONS) if direction == "both" else [direction],
            }
        )
        from model_worker.checks.arguments import check_model_source
        from model_worker.model.loading import load_model
        from model_worker.patching.run import patch as run_patch

        check_model_source(model)
        loaded = quietly(
            lambda: load_model(model, device=device, dtype=dtype, cache_dir=settings.cache_dir)
        )
        result = run_patch(loaded, request, max_tokens=settings.max_prompt_tokens)
    if out is not None:
        written = write_outputs(result, out)
        typer.echo(f"wrote {len(written)} files to {out}", err=True)
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
    else:
        print_summary(result)


def register(app: typer.Typer) -> None:
    app.command()(patch)
