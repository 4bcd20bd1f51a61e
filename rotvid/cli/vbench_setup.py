"""`rotvid vbench-setup`: the separate Python environment VBench runs in."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer

from rotvid.cli.app import app
from rotvid.cli.errors import user_errors


@app.command("vbench-setup")
def vbench_setup(
    venv: Annotated[Optional[Path], typer.Option(help="Where to create the VBench environment "
                                                 "(default: ~/.cache/rotvid/vbench-venv).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands only.")] = False,
) -> None:
    """Create the separate Python environment VBench runs in (vbench pins old transformers/numpy)."""
    with user_errors():
        from rotvid.eval.vbench_runner import DEFAULT_VENV, setup_commands

        target = (venv or DEFAULT_VENV).expanduser()
        if (target / "bin" / "python").exists() and not dry_run:
            raise FileExistsError(f"{target} already exists; use it with --vbench-python {target / 'bin' / 'python'}")
        for cmd in setup_commands(target):
            typer.echo(" ".join(cmd))
            if not dry_run:
                rc = subprocess.call(cmd)
                if rc != 0:
                    raise ValueError(f"command failed with exit code {rc}: {' '.join(cmd)}")
        if not dry_run:
            py = target / "bin" / "python"
            check = subprocess.run([str(py), "-c", "import vbench.utils"], capture_output=True, text=True)
            if check.returncode != 0:
                last = (check.stderr.strip().splitlines() or ["?"])[-1]
                raise ValueError(f"{target} was made but `import vbench` fails there ({last}); torch and torchvision "
                                 "must be builds of the same release from the same index")
            typer.echo(f"done: pass --vbench-python {py} (or set ROTVID_VBENCH_PYTHON)")
