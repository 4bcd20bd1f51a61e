"""The `rotvid` command line (typer). Commands are thin: they hand off to library functions."""

from __future__ import annotations

import typer

from rotvid import __version__

app = typer.Typer(
    name="rotvid",
    help="INT4 self-attention with RoPE-aware rotations for video diffusion transformers.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print the rotvid version."""
    typer.echo(__version__)


@app.command()
def backends() -> None:
    """Show which attention backends run on this machine, and why not where they don't."""
    from rotvid.kernels.dispatch import describe_backends

    for name, reason in describe_backends().items():
        typer.echo(f"{name:10s} {reason}")


if __name__ == "__main__":  # pragma: no cover
    app()
