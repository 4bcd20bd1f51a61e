"""`rotvid backends`: which attention backends run here, and why not where they don't."""

from __future__ import annotations

import typer

from rotvid.cli.app import app


@app.command()
def backends() -> None:
    """Show which attention backends run on this machine, and why not where they don't."""
    from rotvid.kernels.dispatch import describe_backends
    from rotvid.kernels.recipes import int4
    from rotvid.kernels.recipes.auto import auto_recipe

    for name, reason in describe_backends().items():
        typer.echo(f"{name:10s} {reason}")
    recipe, why = auto_recipe()
    typer.echo(f"{'recipe':10s} auto -> {recipe} ({why}); --recipe {int4.RECIPE.name} keeps the paper's INT4 everywhere")
    from rotvid.kernels.cuda_toolkit import describe_compiler

    typer.echo(f"{'compiler':10s} {describe_compiler()}")
