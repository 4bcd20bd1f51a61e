"""Where a benchmark result comes from: the commit, the date and the device a run is labelled with."""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
from pathlib import Path

import torch


def git_commit() -> str:
    """``$ROTVID_COMMIT`` when set (a machine whose git checkout may be stale or absent), else ``git rev-parse --short
    HEAD`` of the checkout this file is in, else ``"unknown"``."""
    commit = os.environ.get("ROTVID_COMMIT")
    if commit:
        return commit
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def utc_stamp() -> str:
    """Now, as the results tables date a run: ``YYYY-MM-DD HH:MM UTC``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def device_description(device: str) -> str:
    """The current CUDA device's name for a ``cuda`` device, else ``CPU (N threads)``."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"CPU ({os.cpu_count()} threads)"
