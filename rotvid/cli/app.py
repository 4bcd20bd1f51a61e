"""The typer app, its callback (--verbose, --version) and the state the commands share."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from rotvid import __version__


app = typer.Typer(
    name="rotvid",
    help="Quantized self-attention (INT4 on Ampere/Ada, INT8/FP8 on Hopper) with RoPE-aware rotations for video "
    "diffusion transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


DEFAULT_MODEL = "wan2.1-t2v-1.3b"


STATE = {"verbose": False}


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details (INFO level).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the rotvid version and exit.")] = False,
) -> None:
    STATE["verbose"] = verbose
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
    elif verbose:
        root.setLevel(logging.INFO)
