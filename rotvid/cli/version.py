"""`rotvid version`."""

from __future__ import annotations

import typer

from rotvid import __version__
from rotvid.cli.app import app


@app.command()
def version() -> None:
    """Print the rotvid version."""
    typer.echo(__version__)
