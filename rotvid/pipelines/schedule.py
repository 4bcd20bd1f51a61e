"""The step x block schedule: which (denoising step, block) self-attention calls stay in FP16, and which of the
quantized ones run dense (no block map).

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

A schedule made for one step count says so (``num_steps``: ``rotvid calibrate`` sets it to the steps it measured):
its table names the (step, block) cells of a run of that many steps, so ``rotvid generate`` / ``eval`` take it when
``--steps`` is not given and refuse a ``--steps`` that differs. The presets are rules at both ends of any run
(``num_steps`` None).

Sparsity rules (for a run with a block map, ``RotvidConfig(sparsity=...)``; what Sparse VideoGen and Radial
Attention set by hand). A block map applies only to calls the rules above quantize -- an FP16 call never gets one --
and a quantized call runs dense (no map) when

* its step is one of the first ``dense_first_steps`` denoising steps (the layout of the video is decided early);
* its block is listed in ``dense_blocks`` (global index in execution order, as ``fp16_cells``; negative indices count
  from the end).

Otherwise it runs the config's sparsity, or its block's own spec from ``block_sparsity`` (``(block, spec)`` pairs,
e.g. ``(3, "topp:0.95")``; ``rotvid calibrate --cosine-floor`` writes a top-p ``tau`` per block there; a spec
``none`` makes that block dense). Outside a tracked run (no step known) the block rules alone apply, as for FP16.

Presets (``SCHEDULE_PRESETS``, :func:`schedule_presets`): ``none``, and the presets each family's module of
:mod:`rotvid.pipelines.families` carries -- the paper's numbers (RotateAttention §5.1): Wan2.2-T2V (40 steps):
first/last 2 steps and blocks -> 81% INT4; Wan2.2-I2V (40 steps): first 6 / last 4 steps, first/last 2 blocks ->
68%; HunyuanVideo-T2V (50 steps): first 4 / last 2 steps, first/last 2 blocks -> 76%.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rotvid.kernels.sparsity import SparsitySpec, parse_sparsity
from rotvid.pipelines.families import schedule_presets as _family_presets

__all__ = ["Schedule", "SCHEDULE_PRESETS", "schedule_preset", "schedule_presets", "expected_quantized_fraction"]


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
        dense_first_steps: quantized calls of the first steps that run without a block map.
        dense_blocks: global block indices whose quantized calls run without a block map (negative: from the end).
        block_sparsity: ``(block, spec)`` pairs: the block map of that block's quantized calls instead of the
            config's (a :class:`~rotvid.kernels.sparsity.SparsitySpec` or its text; ``none``: dense).
        num_steps: the denoising steps the schedule was made for (calibrated at), ``None`` for any run.
    """

    fp16_first_steps: int = 0
    fp16_last_steps: int = 0
    fp16_first_blocks: int = 0
    fp16_last_blocks: int = 0
    fp16_cells: tuple[tuple[int, int], ...] = field(default_factory=tuple)
    name: str | None = None
    dense_first_steps: int = 0
    dense_blocks: tuple[int, ...] = field(default_factory=tuple)
    block_sparsity: tuple[tuple[int, SparsitySpec], ...] = field(default_factory=tuple)
    num_steps: int | None = None

    def __post_init__(self) -> None:
        if self.num_steps is not None and (isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int)
                                           or self.num_steps < 1):
            raise ValueError(f"num_steps: expected a positive int or None, got {self.num_steps!r}")
        for attr in ("fp16_first_steps", "fp16_last_steps", "fp16_first_blocks", "fp16_last_blocks",
                     "dense_first_steps"):
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
        if not isinstance(self.dense_blocks, (tuple, list)) or any(
            isinstance(b, bool) or not isinstance(b, int) for b in self.dense_blocks
        ):
            raise ValueError(f"dense_blocks: expected a list of block indices (ints), got {self.dense_blocks!r}")
        object.__setattr__(self, "dense_blocks", tuple(int(b) for b in self.dense_blocks))
        object.__setattr__(self, "block_sparsity", _block_specs(self.block_sparsity))

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

    def sparsity_at(
        self, base: SparsitySpec, *, step: int | None, num_steps: int | None, block: int, num_blocks: int
    ) -> SparsitySpec | None:
        """The block map spec of a *quantized* call at (``step``, ``block``) -- ``base`` (the config's), or the
        block's own from ``block_sparsity`` -- or ``None`` when it runs dense (a sparsity rule, or the spec is
        ``none``). ``step`` None: outside a tracked run, the block rules alone (``num_steps`` unused)."""
        if step is not None and step < self.dense_first_steps:
            return None
        if any(_absolute(b, num_blocks) == block for b in self.dense_blocks):
            return None
        spec = base
        for b, own in self.block_sparsity:
            if _absolute(b, num_blocks) == block:
                spec = own
        return spec if spec.enabled else None

    @property
    def sparsity_specs(self) -> tuple[SparsitySpec, ...]:
        """The specs of ``block_sparsity`` (what a run may build maps for beside the config's)."""
        return tuple(dict.fromkeys(spec for _, spec in self.block_sparsity))

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
            "dense_first_steps": self.dense_first_steps,
            "dense_blocks": list(self.dense_blocks),
            "block_sparsity": [[b, str(spec)] for b, spec in self.block_sparsity],
            **({"num_steps": self.num_steps} if self.num_steps is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        if not isinstance(d, dict):
            raise ValueError(f"schedule: expected a JSON object, got {type(d).__name__}")
        known = {"fp16_first_steps", "fp16_last_steps", "fp16_first_blocks", "fp16_last_blocks", "fp16_cells", "name",
                 "dense_first_steps", "dense_blocks", "block_sparsity", "num_steps"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"schedule: unknown keys {sorted(unknown)}; expected a subset of {sorted(known)}")
        d = dict(d)
        d["fp16_cells"] = tuple(tuple(c) if isinstance(c, list) else c for c in d.get("fp16_cells", ()))
        d["block_sparsity"] = tuple(tuple(c) if isinstance(c, list) else c for c in d.get("block_sparsity", ()))
        return cls(**d)


def _absolute(block: int, num_blocks: int) -> int:
    return block + num_blocks if block < 0 else block


def _block_specs(pairs) -> tuple[tuple[int, SparsitySpec], ...]:
    """``block_sparsity`` checked: (block, spec) pairs, specs parsed, each block once."""
    if not isinstance(pairs, (tuple, list)):
        raise ValueError(f"block_sparsity: expected a list of (block, sparsity spec) pairs, got {pairs!r}")
    out: dict[int, SparsitySpec] = {}
    for pair in pairs:
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or isinstance(pair[0], bool)
            or not isinstance(pair[0], int)
        ):
            raise ValueError(f"block_sparsity: expected (block, sparsity spec) pairs, got {pair!r}")
        block, spec = pair
        try:
            spec = parse_sparsity(spec)
        except ValueError as err:
            raise ValueError(f"block_sparsity: block {block}: {err}") from None
        if block in out:
            raise ValueError(f"block_sparsity: block {block} given twice")
        out[block] = spec
    return tuple(out.items())


def schedule_presets() -> dict[str, Schedule]:
    """``{name: Schedule}``: ``none`` (no FP16 fallback), then every registered family's presets."""
    presets = {"none": Schedule(name="none")}
    for p in _family_presets():
        presets[p.name] = Schedule(p.fp16_first_steps, p.fp16_last_steps, p.fp16_first_blocks, p.fp16_last_blocks,
                                   name=p.name)
    return presets


def schedule_preset(name: str) -> Schedule:
    """The preset schedule called ``name`` (see :func:`schedule_presets`)."""
    presets = schedule_presets()
    if name not in presets:
        raise ValueError(f"schedule: expected a preset name in {', '.join(presets)}, got {name!r}")
    return presets[name]


def __getattr__(name: str):
    """``SCHEDULE_PRESETS``: :func:`schedule_presets` as of now (a family registered later adds its own)."""
    if name == "SCHEDULE_PRESETS":
        return schedule_presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
