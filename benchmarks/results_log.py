"""The results log the GPU benchmarks append their tables to (``benchmarks/RESULTS.md``): the ``--append`` /
``--no-append`` options and the append."""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def add_append_options(ap: argparse.ArgumentParser) -> None:
    """``--append FILE`` (default :data:`RESULTS` for a full run) and ``--no-append``."""
    ap.add_argument("--append", type=Path, default=None,
                    help=f"results file to append to (default {RESULTS.relative_to(RESULTS.parents[1])} for full runs)")
    ap.add_argument("--no-append", action="store_true", help="print only")


def append_table(md: str, args) -> None:
    """Append ``md`` to ``--append``, else to :data:`RESULTS` unless the run is a ``--tiny`` smoke run; nothing with
    ``--no-append``."""
    target = args.append if args.append is not None else (None if args.tiny else RESULTS)
    if target is not None and not args.no_append:
        with open(target, "a") as fh:
            fh.write("\n" + md)
        print(f"appended to {target}")
