"""What the CPU studies (``accuracy_study.py``, ``sparse_accuracy.py``) share around their numbers: the ``FxHxW``
token-grid argument in, and out the date and command line a run records and its results files
``<prefix>_<YYYYmmdd-HHMMSS>_<commit>.md`` / ``.json``."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parse_grid(text: str) -> tuple[int, int, int]:
    """``FxHxW`` (e.g. ``4x8x12``) -> (F, H, W), each at least 1; an argparse type."""
    try:
        f, h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"grid must look like FxHxW (e.g. 4x8x12), got {text!r}") from None
    if min(f, h, w) < 1:
        raise argparse.ArgumentTypeError(f"grid sizes must be >= 1, got {text!r}")
    return f, h, w


def local_stamp() -> str:
    """Now in local time, as a study's heading dates its run: ``YYYY-MM-DD HH:MM``."""
    return _dt.datetime.now().strftime("%Y-%m-%d %H:%M")


OUTPUT_OPTIONS = ("--json-out", "--markdown-out", "--append")


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that runs ``benchmarks.<script>`` with ``argv`` (None: this process's arguments) from the repository
    root, without its output paths (:data:`OUTPUT_OPTIONS`: where a run wrote is not how to repeat it, and a machine's
    folders do not belong in the repository's results)."""
    args, kept = list(sys.argv[1:] if argv is None else argv), []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in OUTPUT_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(o + "=" for o in OUTPUT_OPTIONS)):
            kept.append(arg)
    return shlex.join(["python", "-m", f"benchmarks.{script}", *kept])


def write_results(out_dir: Path, prefix: str, commit: str, text: str, data: dict) -> Path:
    """``text`` to ``<prefix>_<YYYYmmdd-HHMMSS>_<commit>.md`` and ``data`` to the ``.json`` beside it in ``out_dir``
    (made if missing); returns their path without the suffix."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{prefix}_{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}_{commit}"
    stem.with_name(stem.name + ".md").write_text(text + "\n")
    stem.with_name(stem.name + ".json").write_text(json.dumps(data, indent=1))
    return stem
