"""Choosing which (step, block) self-attention calls stay FP16, from measured INT4 accuracy.

SageAttention's adaptive per-layer choice (``papers/sageattention-zh.md`` §4.5), by step and
block: ``rotvid calibrate`` measures, for every (step, block) of the calibration runs, the
quantized attention output against the FP16 one on the same inputs (cosine similarity and
relative L2, averaged over prompts), and this module turns those measurements into the
explicit ``fp16_cells`` table of a :class:`~rotvid.pipelines.schedule.Schedule`:

* ``cosine_floor``: every cell whose mean cosine is below the floor stays FP16;
* ``target_quantized_fraction``: the worst cells (lowest cosine first) stay FP16 until at most
  that fraction of cells runs quantized (whatever the recipe; ``target_int4_fraction``, its old
  name, is still accepted for one version, with a ``DeprecationWarning``).

Both may be given; a cell is FP16 if either rule says so.

Block maps (top-p): with a cosine floor, :func:`choose_block_sparsity` picks for each block the sparsest
candidate map -- the lowest ``tau`` -- whose mean cosine over the block's measured cells reaches the floor, or dense
when none does; :func:`effective_table` then gives each cell the accuracy of what it will run (the chosen map where
the sparsity rules leave it sparse, dense elsewhere), from which the FP16 cells are chosen as above.
"""

from __future__ import annotations

import dataclasses

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from rotvid.pipelines.schedule import Schedule


class _Unset:
    """The default of a keyword that was not given (``None`` is a value there)."""

    def __repr__(self) -> str:
        return "<not given>"


UNSET = _Unset()


def renamed_target_fraction(new, old, *, stacklevel: int = 3):
    """``target_quantized_fraction`` (``new``), or its old name ``target_int4_fraction`` (``old``).

    The old name is accepted for one version: it warns (``DeprecationWarning``); giving both is
    an error. ``UNSET`` marks a keyword that was not given; returns ``new`` when ``old`` was not.
    """
    if old is UNSET:
        return new
    if new is not None and new is not UNSET:
        raise TypeError("target_quantized_fraction: expected it or its old name target_int4_fraction, not both")
    warnings.warn("target_int4_fraction is deprecated (it is the quantized fraction for every recipe): "
                  "use target_quantized_fraction", DeprecationWarning, stacklevel=stacklevel)
    return old


@dataclass
class CellAccuracy:
    """Accumulated accuracy of the quantized attention at one (step, block) cell."""

    cosine_sum: float = 0.0
    rel_l2_sum: float = 0.0
    count: int = 0

    def add(self, cosine: float, rel_l2: float) -> None:
        self.cosine_sum += cosine
        self.rel_l2_sum += rel_l2
        self.count += 1

    @property
    def cosine(self) -> float:
        return self.cosine_sum / self.count if self.count else math.nan

    @property
    def rel_l2(self) -> float:
        return self.rel_l2_sum / self.count if self.count else math.nan


@dataclass
class AccuracyTable:
    """(step, block) -> accuracy of the quantized attention, over the calibration runs."""

    num_steps: int
    num_blocks: int
    cells: dict[tuple[int, int], CellAccuracy] = field(default_factory=dict)

    def add(self, step: int, block: int, cosine: float, rel_l2: float) -> None:
        if not (0 <= step < self.num_steps and 0 <= block < self.num_blocks):
            raise ValueError(f"step, block: expected within ({self.num_steps}, {self.num_blocks}), got ({step}, {block})")
        self.cells.setdefault((step, block), CellAccuracy()).add(cosine, rel_l2)

    def to_dict(self) -> dict:
        return {
            "num_steps": self.num_steps,
            "num_blocks": self.num_blocks,
            "cells": [
                {"step": s, "block": b, "cosine": c.cosine, "rel_l2": c.rel_l2, "count": c.count}
                for (s, b), c in sorted(self.cells.items())
            ],
        }


def choose_fp16_cells(
    table: AccuracyTable,
    *,
    cosine_floor: float | None = None,
    target_quantized_fraction: float | None = None,
    target_int4_fraction: float | None | _Unset = UNSET,
) -> list[tuple[int, int]]:
    """The (step, block) cells to keep FP16, sorted; see the module docstring for the rules.

    ``target_int4_fraction`` is the old name of ``target_quantized_fraction`` (deprecated).

    Only measured cells are ranked and counted (with Wan2.2's two experts each table holds the
    steps of its own expert); cells never measured are left to the schedule's other rules.
    """
    target = renamed_target_fraction(target_quantized_fraction, target_int4_fraction)
    if cosine_floor is None and target is None:
        raise ValueError("cosine_floor, target_quantized_fraction: expected at least one of them")
    if target is not None and not 0.0 <= target <= 1.0:
        raise ValueError(f"target_quantized_fraction: expected a value in [0, 1], got {target}")
    if cosine_floor is not None and not -1.0 <= cosine_floor <= 1.0:
        raise ValueError(f"cosine_floor: expected a value in [-1, 1], got {cosine_floor}")
    fp16 = set()
    if cosine_floor is not None:
        fp16 |= {cell for cell, acc in table.cells.items() if acc.cosine < cosine_floor}
    if target is not None:
        total = len(table.cells)
        max_quant = math.floor(target * total + 1e-9)
        for cell in sorted(table.cells, key=lambda c: (table.cells[c].cosine, c)):  # worst first
            if total - len(fp16) <= max_quant:
                break
            fp16.add(cell)
    return sorted(fp16)


# top-p taus rotvid calibrate tries above the --sparsity one (sparsest first)
TAU_LADDER = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)


def tau_candidates(tau: float) -> tuple[float, ...]:
    """``tau`` and the :data:`TAU_LADDER` values above it (the candidates of :func:`choose_block_sparsity`)."""
    return (tau, *(t for t in TAU_LADDER if t > tau))


def _block_cosine(table: AccuracyTable, block: int) -> float:
    cells = [acc for (_, b), acc in table.cells.items() if b == block]
    count = sum(c.count for c in cells)
    return sum(c.cosine_sum for c in cells) / count if count else math.nan


def choose_block_sparsity(candidates: dict, cosine_floor: float) -> dict[int, object]:
    """``{block: chosen spec, or None (dense)}`` for every block measured under a map: the candidate with the
    lowest ``tau`` whose mean cosine over the block's cells is at least ``cosine_floor``.

    ``candidates``: ``{top-p SparsitySpec: AccuracyTable}`` of one transformer (the cells measured under it).
    """
    if not -1.0 <= cosine_floor <= 1.0:
        raise ValueError(f"cosine_floor: expected a value in [-1, 1], got {cosine_floor}")
    blocks = sorted({b for table in candidates.values() for (_, b) in table.cells})
    ranked = sorted(candidates.items(), key=lambda item: item[0].options["tau"])
    chosen = {}
    for block in blocks:
        chosen[block] = next((spec for spec, table in ranked if _block_cosine(table, block) >= cosine_floor), None)
    return chosen


def block_sparsity_report(candidates: dict) -> dict[int, dict[str, float]]:
    """``{block: {spec text: mean cosine}}`` of the candidates measured (for the calibration summary)."""
    out: dict[int, dict[str, float]] = {}
    for spec, table in candidates.items():
        for block in sorted({b for (_, b) in table.cells}):
            out.setdefault(block, {})[str(spec)] = _block_cosine(table, block)
    return out


def effective_table(dense: AccuracyTable, candidates: dict, chosen: dict[int, object]) -> AccuracyTable:
    """The accuracy of what each cell will run: the chosen spec's where it was measured (the cells the sparsity
    rules leave sparse), the dense quantized accuracy elsewhere (and for blocks chosen dense)."""
    out = AccuracyTable(num_steps=dense.num_steps, num_blocks=dense.num_blocks)
    for (step, block), acc in dense.cells.items():
        spec = chosen.get(block)
        sparse = candidates[spec].cells.get((step, block)) if spec in candidates else None
        out.cells[(step, block)] = sparse if sparse is not None else acc
    return out


def schedule_from_accuracy(
    table: AccuracyTable,
    *,
    cosine_floor: float | None = None,
    target_quantized_fraction: float | None = None,
    name: str = "calibrated",
    target_int4_fraction: float | None | _Unset = UNSET,
) -> Schedule:
    """A table-only schedule (no first/last rules) keeping the chosen cells FP16, for runs of the table's step count
    (``num_steps``: its cells are those of such a run).

    ``target_int4_fraction`` is the old name of ``target_quantized_fraction`` (deprecated).
    """
    target = renamed_target_fraction(target_quantized_fraction, target_int4_fraction)
    cells = choose_fp16_cells(table, cosine_floor=cosine_floor, target_quantized_fraction=target)
    return Schedule(fp16_cells=tuple(cells), name=name, num_steps=table.num_steps)


def write_schedule(schedule: Schedule, path: str | Path, *, accuracy: AccuracyTable | None = None) -> Path:
    """Write ``schedule`` (and the accuracy it came from) as JSON, atomically. A schedule without ``num_steps``
    gets the accuracy table's: its cells are those of a run of that many steps."""
    path = Path(path)
    if accuracy is not None and schedule.num_steps is None:
        schedule = dataclasses.replace(schedule, num_steps=accuracy.num_steps)
    payload = {"version": 1, "schedule": schedule.to_dict()}
    if accuracy is not None:
        payload["accuracy"] = accuracy.to_dict()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
    return path


def read_schedule(path: str | Path) -> Schedule:
    """Read a schedule JSON written by :func:`write_schedule` (or a bare ``Schedule.to_dict()``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"schedule: file not found: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"schedule: {path} is not valid JSON ({err})") from None
    return Schedule.from_dict(data["schedule"] if isinstance(data, dict) and "schedule" in data else data)
