"""Writing files whole or not at all: a temporary name in the same folder, then a rename."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_can_write", "temporary_path", "write_file_atomically"]


def temporary_path(path: Path) -> Path:
    """The name a file is written under before it is complete: hidden, same folder, same suffix."""
    path = Path(path)
    return path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")


def check_can_write(path: Path, *, overwrite: bool, what: str = "output") -> None:
    """Raise ``FileExistsError`` when ``path`` exists and ``overwrite`` is false."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{what} {path} already exists (pass --overwrite to replace it)")


def write_file_atomically(path: Path, data: bytes | str, *, overwrite: bool = True) -> Path:
    """Write a small text or binary file through a temporary name and a rename."""
    path = Path(path)
    check_can_write(path, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
