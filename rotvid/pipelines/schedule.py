"""The FP16-fallback schedule: which (denoising step, block) self-attention calls stay in FP16.

A call runs the quantized recipe unless one of these says FP16:

* the first ``fp16_first_steps`` or the last ``fp16_last_steps`` denoising steps;
* the first ``fp16_first_blocks`` or the last ``fp16_last_blocks`` blocks **of each block stack**
  (HunyuanVideo has a double-stream stack of 20 and a single-stream stack of 40 blocks; Wan and
  CogVideoX have one stack). Counting per stack is what reproduces the paper's HunyuanVideo
  figure: (44/50 steps) x (52/60 blocks) = 76%;
* the explicit table ``fp16_cells``: ``[step, block]`` pairs, ``block`` being the global index of
  the self-attention in execution order (all stacks in sequence). Negative indices count from
  the end, as in Python (``[-1, 0]`` is block 0 of the last step). ``rotvid calibrate`` writes
  these.

The rules are additive: a cell is FP16 if any of them says so. For full control from a table, set
the four counts to 0.

Presets (``SCHEDULE_PRESETS``) carry the paper's numbers (RotateAttention §5.1):
Wan2.2-T2V (40 steps): first/last 2 steps and blocks -> 81% INT4; Wan2.2-I2V (40 steps): first 6 /
last 4 steps, first/last 2 blocks -> 68%; HunyuanVideo-T2V (50 steps): first 4 / last 2 steps,
first/last 2 blocks -> 76%.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Schedule", "SCHEDULE_PRESETS", "schedule_preset", "expected_quantized_fraction"]


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {value!r}")


@dataclass(frozen=True)
class Schedule:
    """FP16 fallback by step and block (see the module docstring).

    Attributes:
        fp16_first_steps / fp16_last_steps: denoising steps kept in FP16 at each end.
        fp16_first_blocks / fp16_last_blocks: blocks kept in FP16 at each end of every stack.
        fp16_cells: explicit ``(step, block)`` pairs kept in FP16 (global block index; negative
            indices count from the end).
        name: preset name, for reports (``None`` for a hand-made schedule).
    """

    fp16_first_steps: int = 0
    fp16_last_steps: int = 0
    fp16_first_blocks: int = 0
    fp16_last_blocks: int = 0
    fp16_cells: tuple[tuple[int, int], ...] = field(default_factory=tuple)
    name: str | None = None

    def __post_init__(self) -> None:
        for attr in ("fp16_first_steps", "fp16_last_steps", "fp16_first_blocks", "fp16_last_blocks"):
            _check_count(attr, getattr(self, attr))
        if not isinstance(self.fp16_cells, (tuple, list)):
            raise ValueError(f"fp16_cells: expected a list of (step, block) pairs, got {self.fp16_cells!r}")
        cells = []
        for cell in self.fp16_cells:
            if (
                not isinstance(cell, (tuple, list))
                or len(cell) != 2
                or any(isinstance(c, bool) or not isinstance(c, int) for c in cell)
            ):
                raise ValueError(f"fp16_cells: expected (step, block) pairs of ints, got {cell!r}")
            cells.append((int(cell[0]), int(cell[1])))
        object.__setattr__(self, "fp16_cells", tuple(cells))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"name: expected a str or None, got {self.name!r}")

    def fp16_reason(
        self,
        *,
        step: int,
        num_steps: int,
        block: int,
        num_blocks: int,
        block_in_stack: int,
        stack_size: int,
    ) -> str | None:
        """Why the call at (``step``, ``block``) runs FP16, or ``None`` when it runs quantized.

        Args:
            step / num_steps: 0-based denoising step and the run's step count.
            block / num_blocks: global self-attention index and count (all stacks).
            block_in_stack / stack_size: index within its stack and that stack's length.
        """
        if step < self.fp16_first_steps:
            return f"schedule: first {self.fp16_first_steps} steps"
        if step >= num_steps - self.fp16_last_steps:
            return f"schedule: last {self.fp16_last_steps} steps"
        if block_in_stack < self.fp16_first_blocks:
            return f"schedule: first {self.fp16_first_blocks} blocks"
        if block_in_stack >= stack_size - self.fp16_last_blocks:
            return f"schedule: last {self.fp16_last_blocks} blocks"
        for s, b in self.fp16_cells:
            s_abs = s + num_steps if s < 0 else s
            b_abs = b + num_blocks if b < 0 else b
            if s_abs == step and b_abs == block:
                return "schedule: table"
        return None

    def block_fp16_reason(self, *, block_in_stack: int, stack_size: int) -> str | None:
        """The block rules alone (``fp16_first_blocks`` / ``fp16_last_blocks``): the rule for a call outside a
        tracked denoising run, where no step is known (the step rules and the ``fp16_cells`` table need one)."""
        if block_in_stack < self.fp16_first_blocks:
            return f"schedule: first {self.fp16_first_blocks} blocks"
        if block_in_stack >= stack_size - self.fp16_last_blocks:
            return f"schedule: last {self.fp16_last_blocks} blocks"
        return None

    def to_dict(self) -> dict:
        return {
            "fp16_first_steps": self.fp16_first_steps,
            "fp16_last_steps": self.fp16_last_steps,
            "fp16_first_blocks": self.fp16_first_blocks,
            "fp16_last_blocks": self.fp16_last_blocks,
            "fp16_cells": [list(c) for c in self.fp16_cells],
            "name": self.name,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        if not isinstance(d, dict):
            raise ValueError(f"schedule: expected a JSON object, got {type(d).__name__}")
        known = {"fp16_first_steps", "fp16_last_steps", "fp16_first_blocks", "fp16_last_blocks", "fp16_cells", "name"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"schedule: unknown keys {sorted(unknown)}; expected a subset of {sorted(known)}")
        d = dict(d)
        d["fp16_cells"] = tuple(tuple(c) if isinstance(c, list) else c for c in d.get("fp16_cells", ()))
        return cls(**d)


SCHEDULE_PRESETS: dict[str, Schedule] = {
    "none": Schedule(name="none"),
    "paper-wan2.2-t2v": Schedule(2, 2, 2, 2, name="paper-wan2.2-t2v"),
    "paper-wan2.2-i2v": Schedule(6, 4, 2, 2, name="paper-wan2.2-i2v"),
    "paper-hunyuan-t2v": Schedule(4, 2, 2, 2, name="paper-hunyuan-t2v"),
}


def schedule_preset(name: str) -> Schedule:
    """The preset schedule called ``name`` (see ``SCHEDULE_PRESETS``)."""
    if name not in SCHEDULE_PRESETS:
        raise ValueError(f"schedule: expected a preset name in {', '.join(SCHEDULE_PRESETS)}, got {name!r}")
    return SCHEDULE_PRESETS[name]


def expected_quantized_fraction(schedule: Schedule, num_steps: int, stack_sizes: tuple[int, ...]) -> float:
    """Fraction of (step, block) cells the schedule runs quantized (every cell weighted equally)."""
    num_blocks = sum(stack_sizes)
    quant = 0
    for step in range(num_steps):
        block = 0
        for size in stack_sizes:
            for i in range(size):
                reason = schedule.fp16_reason(
                    step=step, num_steps=num_steps, block=block, num_blocks=num_blocks,
                    block_in_stack=i, stack_size=size,
                )
                quant += reason is None
                block += 1
    return quant / (num_steps * num_blocks)
