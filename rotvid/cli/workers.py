"""--gpus N: the command run again on N torchrun workers (context parallelism)."""

from __future__ import annotations

import typer

from rotvid.cli.app import STATE


def _cli_args_of_this_command(ctx: typer.Context) -> list[str]:
    """The current command's arguments, rebuilt from the parsed values (for the torchrun workers)."""
    args = ["--verbose"] if STATE["verbose"] else []
    args.append(ctx.info_name)
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None:
            continue
        if param.param_type_name == "argument":
            args.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        elif getattr(param, "is_flag", False):
            if value:
                args.append(param.opts[0])
            elif getattr(param, "secondary_opts", None):  # --x/--no-x given as False: pass --no-x on
                args.append(param.secondary_opts[0])
        else:
            args.extend([param.opts[0], str(value)])
    return args


def launch_workers(ctx: typer.Context, gpus: int, device: str) -> bool:
    """With --gpus N > 1 in the launching process: run this command on N torchrun workers (True)."""
    from rotvid.distributed_run import check_gpus, in_launched_worker, launch

    check_gpus(gpus, device)
    if gpus == 1 or in_launched_worker():
        return False
    rc = launch(gpus, _cli_args_of_this_command(ctx))
    if rc != 0:
        typer.echo(f"Error: --gpus {gpus}: the worker processes failed (torchrun exit code {rc}; their messages "
                   "are above)", err=True)
        raise typer.Exit(1)
    return True


def join_workers(gpus: int, device: str):
    """Inside a torchrun worker: join the process group (WorkerInfo); single process: None."""
    from rotvid.distributed_run import init_worker

    if gpus == 1:
        return None
    import atexit

    from rotvid.distributed_run import shutdown_worker

    worker = init_worker(gpus, device)
    atexit.register(shutdown_worker)
    return worker


def finish_workers(worker) -> None:
    """A multi-process run's normal end: every rank leaves together (distributed_run.finish_worker)."""
    if worker is not None:
        from rotvid.distributed_run import finish_worker

        finish_worker()
