"""Progress display on stderr (rich): a bar over denoising steps, and eval's events on it."""

from __future__ import annotations

from pathlib import Path


class StepProgress:
    """A rich progress bar over denoising steps (stderr), or nothing with --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.progress = None
        self.task = None
        self.console = None

    def __enter__(self):
        if not self.quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.console = Console(stderr=True)
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
            )
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)
        return False

    def log(self, text: str) -> None:
        if self.console is not None:  # (soft_wrap: a path in the line is never broken across lines)
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def start(self, description: str) -> None:
        if self.progress is not None:
            self.task = self.progress.add_task(description, total=None)

    def step(self, done: int, total: int) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=done, total=total)


class EvalEvents:
    def __init__(self, bar: StepProgress, compiling: bool = False):
        self.bar = bar
        self.compiling = compiling

    def loading(self, model: str) -> None:
        self.bar.log(f"loading {model} ...")

    def video_started(self, label: str, name: str, index: int, total: int) -> None:
        self.bar.start(f"[{index + 1}/{total}] {label}/{name[:28]}")
        if self.compiling:
            from rotvid.pipelines.compiling import COMPILE_MESSAGE

            self.bar.log(COMPILE_MESSAGE)

    def step(self, done: int, total: int) -> None:
        self.bar.step(done, total)

    def video_done(self, path: Path, skipped: bool) -> None:
        if skipped:
            self.bar.log(f"kept {path} (already generated)")
            self.bar.step(1, 1)

    def measuring(self, label: str, name: str) -> None:
        self.bar.log(f"measuring {label}/{name}")

    def vbench(self, line: str) -> None:
        self.bar.log(line)
