"""Bad input ends with one line on stderr, ``Error: ...``, and exit code 1 — never a traceback."""

from __future__ import annotations

import contextlib

import typer

from rotvid.cli.app import STATE


@contextlib.contextmanager
def user_errors():
    """Turn bad input into one line on stderr and exit code 1."""
    from rotvid.eval.vbench_runner import VBenchError

    try:
        yield
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
            PermissionError, VBenchError) as exc:
        fail(exc)
    except OSError as exc:  # e.g. a hub id that cannot be fetched offline
        fail(exc)
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not isinstance(exc, MemoryError) and not any(s in str(exc) for s in ("out of memory", "allocate memory")):
            raise
        fail(RuntimeError(f"out of memory ({' '.join(str(exc).split())[:200]}): ask for a smaller --height, --width, "
                           "--frames or --max-sequence-length, or use a device with more memory"))
    except KeyboardInterrupt:
        typer.echo("Interrupted (finished videos are kept; run the same command again to resume: `rotvid eval` and "
                   "`rotvid generate --prompt-file` skip them).", err=True)
        raise typer.Exit(130) from None


def fail(exc: BaseException) -> None:
    if STATE["verbose"]:  # --verbose: the traceback too, for bug reports
        import traceback

        traceback.print_exception(exc)
    msg = " ".join(str(exc).split()) or type(exc).__name__
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(1) from None
