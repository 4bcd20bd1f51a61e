"""Which denoising step the pipeline is in, whatever the CFG mode and however many experts.

Counting transformer forwards cannot tell steps apart: Wan runs cond and uncond as two forwards
per step, CogVideoX one forward on a doubled batch, HunyuanVideo one (guidance-distilled) or two
(true CFG), and Wan2.2 A14B switches between two transformers mid-run. What every diffusers
pipeline does exactly once per step is call ``scheduler.step``; and it calls
``scheduler.set_timesteps`` once before the loop. So the tracker wraps those two methods of the
pipeline's scheduler *instance* (``functools.wraps`` keeps their signatures, which diffusers
inspects for ``sigmas`` / ``eta`` / ``generator``):

* ``set_timesteps(...)`` -> a new run: step 0 of ``len(scheduler.timesteps)`` steps;
* ``step(...)`` -> the next step.

Both experts of Wan2.2 share the one scheduler, so steps count across them. ``remove`` deletes
the wrappers again. Without a pipeline (a bare transformer, as in the benchmarks), call
:meth:`StepTracker.begin` / :meth:`StepTracker.set_step` by hand.

Calls outside a tracked run (no run begun, or past its last step: the transformer called directly,
by a second pipeline that shares it, or in a custom loop that drives no tracked scheduler) are not
an error: the runtime gives them the schedule's block rules only (:mod:`rotvid.pipelines.runtime`)
and the report counts them as untracked forwards. A scheduler swapped after ``apply`` is followed
(:meth:`StepTracker.follow`, called by the forward guard before the next forward).
"""

from __future__ import annotations

import functools
import logging

__all__ = ["StepTracker", "StepUnknownError"]

logger = logging.getLogger(__name__)

_MISSING = object()


class StepUnknownError(RuntimeError):
    """A self-attention call came while no denoising run was being tracked."""


class StepTracker:
    """Counts denoising steps from the scheduler's ``set_timesteps`` / ``step`` calls.

    Attributes:
        step: 0-based current step, ``None`` before the first run.
        num_steps: step count of the current run, ``None`` before the first run.
        runs: number of runs begun (``set_timesteps`` calls).
        forwards_per_step: transformer forwards seen in each step of the current run, as
            ``{step: {transformer_name: count}}`` (filled by the runtime from the calls of each
            transformer's first self-attention, when the step changes or the report is read).
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.num_steps: int | None = None
        self.runs = 0
        self.forwards_per_step: dict[int, dict[str, int]] = {}
        self._scheduler = None
        self._saved: dict[str, object] = {}
        self._listeners: list = []
        # () -> bool: the pipeline stopped its run early (diffusers' ``pipe._interrupt``: the loop skips the
        # remaining steps, so no scheduler.step says so); set by apply for a pipeline
        self.interrupted = None

    def add_listener(self, listener) -> None:
        """Call ``listener("leave")`` before and ``listener("enter")`` after each change of step."""
        self._listeners.append(listener)

    def remove_listener(self, listener) -> None:
        self._listeners = [fn for fn in self._listeners if fn != listener]

    def _notify(self, phase: str) -> None:
        for listener in list(self._listeners):
            listener(phase)

    # ---- manual control ----------------------------------------------------------------
    def begin(self, num_steps: int) -> None:
        """Start a run of ``num_steps`` steps at step 0."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps: expected a positive int, got {num_steps!r}")
        self._notify("leave")
        self.num_steps = num_steps
        self.step = 0
        self.runs += 1
        self.forwards_per_step = {}
        self._notify("enter")

    def set_step(self, step: int, num_steps: int | None = None) -> None:
        """Jump to ``step`` (of ``num_steps``, or of the current run)."""
        if num_steps is not None and num_steps != self.num_steps:
            self.begin(num_steps)
        if self.num_steps is None:
            raise StepUnknownError("set_step: no run begun; pass num_steps or call begin(num_steps) first")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < self.num_steps:
            raise ValueError(f"step: expected an int in [0, {self.num_steps}), got {step!r}")
        self._notify("leave")
        self.step = step
        self._notify("enter")

    def advance(self) -> None:
        if self.step is not None:
            self._notify("leave")
            self.step += 1
            self._notify("enter")

    def end(self) -> None:
        """End the current run as if its last step were done (the pipeline stopped it early)."""
        if self.step is not None and self.num_steps is not None and self.step < self.num_steps:
            self._notify("leave")
            self.step = self.num_steps
            self._notify("enter")

    def _end_if_interrupted(self) -> None:
        if self.interrupted is not None and self.step is not None and self.interrupted():
            self.end()

    def current(self) -> tuple[int, int]:
        """``(step, num_steps)`` of the call being made.

        Raises:
            StepUnknownError: no run is being tracked, or the run went past its last step.
        """
        self._end_if_interrupted()
        if self.step is None or self.num_steps is None:
            raise StepUnknownError(
                "rotvid: the denoising step is unknown (the scheduler's set_timesteps was not seen). "
                "Run the pipeline itself, or call handle.tracker.begin(num_steps) / set_step(i) when "
                "calling the transformer directly."
            )
        if self.step >= self.num_steps:
            raise StepUnknownError(
                f"rotvid: a self-attention call after the last denoising step ({self.step} of {self.num_steps})"
            )
        return self.step, self.num_steps

    def in_run(self) -> bool:
        """True while a denoising run is tracked (a step of it is current; a run the pipeline interrupted is over)."""
        self._end_if_interrupted()
        return self.step is not None and self.num_steps is not None and self.step < self.num_steps

    def count_forward(self, name: str, n: int = 1) -> None:
        """Add ``n`` forwards of transformer ``name`` to the current step (nothing when no run is tracked)."""
        if not self.in_run():
            return
        per = self.forwards_per_step.setdefault(self.step, {})
        per[name] = per.get(name, 0) + n

    # ---- scheduler wrapping ---------------------------------------------------------------
    def attach(self, scheduler) -> None:
        """Wrap ``scheduler.set_timesteps`` and ``scheduler.step`` (instance attributes)."""
        if self._scheduler is not None:
            raise RuntimeError("StepTracker.attach: already attached to a scheduler")
        for name in ("set_timesteps", "step"):
            if not callable(getattr(scheduler, name, None)):
                raise ValueError(f"scheduler: expected a diffusers scheduler with a {name}() method, got {scheduler!r}")
        tracker = self
        original_set = scheduler.set_timesteps
        original_step = scheduler.step

        @functools.wraps(original_set)
        def set_timesteps(*args, **kwargs):
            out = original_set(*args, **kwargs)
            tracker.begin(len(scheduler.timesteps))
            logger.debug("rotvid: new denoising run of %d steps", tracker.num_steps)
            return out

        @functools.wraps(original_step)
        def step(*args, **kwargs):
            out = original_step(*args, **kwargs)
            tracker.advance()
            return out

        self._saved = {n: scheduler.__dict__.get(n, _MISSING) for n in ("set_timesteps", "step")}
        scheduler.set_timesteps = set_timesteps
        scheduler.step = step
        self._scheduler = scheduler

    def detach(self) -> None:
        """Undo :meth:`attach` (restores whatever instance attributes were there before)."""
        sched = self._scheduler
        if sched is None:
            return
        for name, prev in self._saved.items():
            if prev is _MISSING:
                sched.__dict__.pop(name, None)
            else:
                setattr(sched, name, prev)
        self._scheduler = None
        self._saved = {}

    def follow(self, scheduler) -> None:
        """Follow a scheduler that replaced the attached one (``pipe.scheduler = ...`` after ``apply``).

        Detaches from the old scheduler and wraps the new one. When the new one already has its timesteps (the
        pipeline called its ``set_timesteps`` before the first forward), a run of ``len(timesteps)`` steps begins
        at the scheduler's own ``step_index`` (0 when it has none yet).
        """
        self.detach()
        self.attach(scheduler)
        timesteps = getattr(scheduler, "timesteps", None)
        if timesteps is not None and len(timesteps) > 0:
            self.begin(len(timesteps))
            index = getattr(scheduler, "step_index", None)
            if isinstance(index, int) and 0 < index < len(timesteps):
                self.set_step(index)
        logger.info("rotvid: pipe.scheduler was replaced after apply; the step tracker follows the new one")

    @property
    def scheduler(self):
        return self._scheduler
