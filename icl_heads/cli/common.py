"""What every `icl-heads` command shares: the group that turns bad input into one `error: …`
line with exit code 2, quiet model loading, the common options, settings with overrides.

Imports no other CLI module (icl_heads.cli and icl_heads.cli compose the commands).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from typer._click.exceptions import UsageError  # typer's own (vendored) click
from typer.core import TyperGroup

from model_worker.common.defaults import DType
from model_worker.common.errors import UserInputError
from model_worker.common.settings import Settings, get_settings

T = TypeVar("T")


#: the width of help printed to a pipe or a file (COLUMNS unset): no option or help text cut
PIPED_HELP_WIDTH = 120


def help_width() -> int | None:
    """The width help is drawn at: the terminal's (None: rich reads it), else COLUMNS, else
    PIPED_HELP_WIDTH."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_HELP_WIDTH


class OneLineErrors(TyperGroup):
    """The `icl-heads` group: an option value typer refuses (a choice, a range, a number), an
    unknown option or command, a missing argument: one `error: …` line on stderr and exit
    code 2, like every other input error. Help is drawn at the terminal's width."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        from typer import rich_utils

        rich_utils.MAX_WIDTH = help_width()
        return super().main(*args, **kwargs)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:  # the group's own options
            usage_error(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:  # a command's options and arguments, a bad value
            usage_error(exc)
        except (SettingsError, ValidationError) as exc:
            if isinstance(exc, ValidationError) and exc.title != Settings.__name__:
                raise
            typer.echo(f"error: {setting_problem(exc)}", err=True)
            raise typer.Exit(2) from None


def usage_error(exc: UsageError) -> NoReturn:
    """One line on stderr, exit 2: `error: No such option: --bogus … (see icl-heads serve
    --help)`; a value typer refuses, as it words it."""
    message = exc.format_message().replace(": Value error, ", ": ")
    if not isinstance(exc, typer.BadParameter):
        where = exc.ctx.command_path if exc.ctx else "icl-heads"
        message = f"{message.rstrip('.')} (see {where} --help)"
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2) from None


def setting_problem(exc: SettingsError | ValidationError) -> str:
    """One line for an `ICL_*` variable (or `.env` entry) the settings cannot read."""
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        name = "ICL_" + "_".join(str(part) for part in error["loc"]).upper()
        return f"the setting {name} is invalid: {error['msg']}"
    match = re.search(r'field "(\w+)"', str(exc))
    name = f"ICL_{match[1].upper()}" if match else "an ICL_* setting"
    return f'the setting {name} cannot be read: a list or a map is JSON, e.g. \'["a", "b"]\''


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserInputError into `error: …` on stderr and exit code 2."""
    try:
        yield
    except UserInputError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def quietly(load: Callable[[], T]) -> T:
    """Run `load` with transformers' progress bars and warnings silenced."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_logging.set_verbosity_error()
    return load()


def settings_with(**overrides: object) -> Settings:
    """The environment's settings with the command-line options that were given."""
    given = {key: value for key, value in overrides.items() if value is not None}
    return get_settings().model_copy(update=given)


ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="HF id, local folder or .gguf (default SmolLM2)."),
]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:0 …")]
DTypeOption = Annotated[DType, typer.Option(help="Weight dtype.")]
