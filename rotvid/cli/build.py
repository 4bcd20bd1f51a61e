"""`rotvid build`: compile the CUDA kernels ahead of time, into the extension cache."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from rotvid.cli.app import app
from rotvid.cli.errors import fail, user_errors
from rotvid.cli.options import check_positive


@app.command()
def build(
    arch: Annotated[Optional[str], typer.Option("--arch", help="Build for this GPU architecture (sm80, sm86, sm87, "
                                                "sm89, sm90a) instead of this machine's GPU; needs torch's CUDA "
                                                "build.")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="Parallel compile jobs (default: $MAX_JOBS, "
                                                "else every core).")] = None,
) -> None:
    """Compile the CUDA kernels for this machine's GPU ahead of time, into the extension cache."""
    with user_errors():
        import os

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
            TimeElapsedColumn

        from rotvid.kernels import cuda_build

        check_positive("--jobs", jobs)
        if jobs is not None:
            os.environ["MAX_JOBS"] = str(jobs)
        cap = cuda_build.parse_arch(arch) if arch is not None else None
        try:
            plan = cuda_build.plan_build(cap)  # no GPU, a CPU torch, no compiler or one that does not fit: here
            typer.echo(f"compiler: {plan.toolkit.describe()}")
            console = Console(stderr=True)
            verb = "loading" if plan.built else "building"
            console.print(f"{verb} {plan.name} into {plan.folder}", markup=False, highlight=False, soft_wrap=True)
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("objects"), TimeElapsedColumn(), console=console, transient=False) as bar:
                task = bar.add_task(f"{verb} the {plan.arch} kernels", total=None)
                seconds = cuda_build.build_extension(
                    plan, on_progress=lambda done, total: bar.update(task, completed=done, total=total))
        except RuntimeError as exc:  # also a failed compile: its log is above
            fail(exc)
        if seconds is None:
            last = cuda_build.last_build()
            took = f"; the last build took {last['seconds']:.0f} s" if last and "seconds" in last else ""
            typer.echo(f"up to date: {plan.name} ({plan.arch}) in {plan.folder}{took}")
        else:
            typer.echo(f"built {plan.name} ({plan.arch}) in {seconds:.0f} s into {plan.folder} (recorded in "
                       f"{plan.folder / 'build.json'})")
