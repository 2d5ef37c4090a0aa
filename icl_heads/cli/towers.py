"""`icl-heads towers`: why one head attends from the last position to a source position, its
pre-softmax score decomposed into (query-side, key-side) component pairs and token slots
(docs/towers.md). Bad input prints one line and exits with code 2, before the model loads
where it can."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from icl_heads.cli.common import DeviceOption, DTypeOption, ModelOption, quietly, user_errors
from model_worker.common.errors import UserInputError
from model_worker.common.settings import get_settings
from model_worker.contracts.common import parse_head_name

if TYPE_CHECKING:
    from model_worker.contracts.towers import Towers

SHOWN = 10  # rows per section of the text output


def _checked(head: str, position: int | None, versus: int | None) -> None:
    """UserInputError for a malformed head name or a negative position (no model needed)."""
    try:
        parse_head_name(head)
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    for name, value in (("--position", position), ("--versus", versus)):
        if value is not None and value < 0:
            raise UserInputError(f"{name} {value} is not a token position (0 or more)")


def print_towers(result: Towers) -> None:
    """The decomposition as text: score, largest terms, components and token slots."""
    what = f"{result.head}: last token {result.query_token!r} ({result.query_position}) → "
    what += f"{result.token!r} ({result.position})"
    if result.versus is not None:
        what += f" minus → {result.versus_token!r} ({result.versus})"
    typer.echo(what)
    cap = f"; soft-cap {result.softcap:g} applies after" if result.softcap else ""
    typer.echo(
        f"score {result.score:+.4f} (pre-cap; the model's {result.model_score:+.4f}{cap}); "
        f"rotary position part {result.position_part:+.4f}"
    )
    note = result.window_note()
    if note is not None:
        typer.echo(f"note: {note}")
    typer.echo(f"\nlargest terms (of {result.n_terms}), query-side × key-side:")
    for term in result.terms[:SHOWN]:
        typer.echo(f"  {term.query:>12} × {term.key:<12} {term.value:+.4f}")
    for side, components in (("query side", result.query), ("key side", result.key)):
        typer.echo(f"\n{side}, largest components:")
        for c in sorted(components, key=lambda c: -abs(c.value))[:SHOWN]:
            typer.echo(f"  {c.name:>12} {c.value:+.4f}")
    for side, slots in (("query", result.tokens.query), ("key", result.tokens.key)):
        typer.echo(f"\n{side}-side tokens, largest:")
        for s in sorted(slots, key=lambda s: -abs(s.value))[:SHOWN]:
            where = "" if s.position is None else f"{s.position:>4} "
            typer.echo(f"  {where}{s.token!r:<14} {s.value:+.4f}")


def towers(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The ICL prompt.")],
    head: Annotated[str, typer.Option("--head", help="The head, e.g. L23H1.")],
    position: Annotated[
        int | None,
        typer.Option(help="Source token position (default: the label the head attends most)."),
    ] = None,
    versus: Annotated[
        int | None, typer.Option(help="Decompose score(position) − score(versus).")
    ] = None,
    terms: Annotated[
        int, typer.Option("--terms", min=0, help="Largest terms listed (0: all).")
    ] = 40,
    model: ModelOption = None,
    device: DeviceOption = "auto",
    dtype: DTypeOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Why a head attends there: its score decomposed into the two towers' components."""
    settings = get_settings()
    with user_errors():
        _checked(head, position, versus)
        from model_worker.model.loading import load_model
        from model_worker.towers.run import towers as decompose

        loaded = quietly(
            lambda: load_model(model, device=device, dtype=dtype, cache_dir=settings.cache_dir)
        )
        result = decompose(
            loaded,
            prompt,
            head=head.strip(),
            position=position,
            versus=versus,
            n_terms=terms,
            max_tokens=settings.max_prompt_tokens,
        )
    if as_json:
        sys.stdout.write(result.model_dump_json() + "\n")
    else:
        print_towers(result)


def register(app: typer.Typer) -> None:
    app.command("towers")(towers)
