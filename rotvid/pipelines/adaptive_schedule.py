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
when none does; :func:`choose_sparse_schedule` chooses the dense first steps with the maps (the count whose maps meet
the floor at every step at the highest expected speed-up, from the kernel's time-vs-density line of
:mod:`rotvid.kernels.sparsity.cost`); :func:`effective_table` then gives each cell the accuracy of what it will run
(the chosen map where the sparsity rules leave it sparse, dense elsewhere), from which the FP16 cells are chosen as
above. The cells measured under a map also hold its density and kept attention mass beside the oracle's
(:func:`block_map_measures`).
"""

from __future__ import annotations

import dataclasses

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from rotvid.kernels.sparsity.cost import attention_speedup
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
    """Accumulated accuracy of the quantized attention at one (step, block) cell; for a cell measured under a block
    map also the map's density and the attention mass it keeps, beside the oracle's at the same per-row block counts
    (:func:`rotvid.kernels.sparsity.oracle.kept_mass`, :func:`~rotvid.kernels.sparsity.oracle.oracle_kept_mass`)."""

    cosine_sum: float = 0.0
    rel_l2_sum: float = 0.0
    count: int = 0
    density_sum: float = 0.0
    density_count: int = 0
    kept_mass_sum: float = 0.0
    oracle_kept_mass_sum: float = 0.0
    mass_count: int = 0

    def add(self, cosine: float, rel_l2: float, *, density: float | None = None, kept_mass: float | None = None,
            oracle_kept_mass: float | None = None) -> None:
        """One call's measurement (``density`` and the two kept masses: of a call under a map; the masses both or
        neither)."""
        if (kept_mass is None) != (oracle_kept_mass is None):
            raise ValueError("kept_mass, oracle_kept_mass: expected both or neither")
        self.cosine_sum += cosine
        self.rel_l2_sum += rel_l2
        self.count += 1
        if density is not None:
            self.density_sum += density
            self.density_count += 1
        if kept_mass is not None:
            self.kept_mass_sum += kept_mass
            self.oracle_kept_mass_sum += oracle_kept_mass
            self.mass_count += 1

    def merge(self, other: "CellAccuracy") -> None:
        """Add ``other``'s measurements to these."""
        for name in ("cosine_sum", "rel_l2_sum", "count", "density_sum", "density_count", "kept_mass_sum",
                     "oracle_kept_mass_sum", "mass_count"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def cosine(self) -> float:
        return _ratio(self.cosine_sum, self.count)

    @property
    def rel_l2(self) -> float:
        return _ratio(self.rel_l2_sum, self.count)

    @property
    def density(self) -> float:
        """Mean density of the map over the calls measured under one (NaN: none was)."""
        return _ratio(self.density_sum, self.density_count)

    @property
    def kept_mass(self) -> float:
        """Mean attention mass the map kept (NaN: not measured)."""
        return _ratio(self.kept_mass_sum, self.mass_count)

    @property
    def oracle_kept_mass(self) -> float:
        """Mean attention mass the oracle keeps with the map's per-row block counts (NaN: not measured)."""
        return _ratio(self.oracle_kept_mass_sum, self.mass_count)


def _ratio(total: float, count: int) -> float:
    return total / count if count else math.nan


@dataclass
class AccuracyTable:
    """(step, block) -> accuracy of the quantized attention, over the calibration runs."""

    num_steps: int
    num_blocks: int
    cells: dict[tuple[int, int], CellAccuracy] = field(default_factory=dict)

    def add(self, step: int, block: int, cosine: float, rel_l2: float, **map_measures) -> None:
        """One call at (``step``, ``block``); ``map_measures``: :meth:`CellAccuracy.add`'s ``density``,
        ``kept_mass`` and ``oracle_kept_mass`` for a call under a map."""
        if not (0 <= step < self.num_steps and 0 <= block < self.num_blocks):
            raise ValueError(f"step, block: expected within ({self.num_steps}, {self.num_blocks}), got ({step}, {block})")
        self.cells.setdefault((step, block), CellAccuracy()).add(cosine, rel_l2, **map_measures)

    def to_dict(self) -> dict:
        """Every cell's means (with ``density``, ``kept_mass`` and ``oracle_kept_mass`` where they were measured)."""
        return {
            "num_steps": self.num_steps,
            "num_blocks": self.num_blocks,
            "cells": [_cell_dict(s, b, c) for (s, b), c in sorted(self.cells.items())],
        }


def _cell_dict(step: int, block: int, cell: CellAccuracy) -> dict:
    out = {"step": step, "block": block, "cosine": cell.cosine, "rel_l2": cell.rel_l2, "count": cell.count}
    if cell.density_count:
        out["density"] = cell.density
    if cell.mass_count:
        out["kept_mass"], out["oracle_kept_mass"] = cell.kept_mass, cell.oracle_kept_mass
    return out


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


def _block_cells(table: AccuracyTable, block: int, from_step: int = 0) -> list[CellAccuracy]:
    return [acc for (step, b), acc in table.cells.items() if b == block and step >= from_step]


def _block_cosine(table: AccuracyTable, block: int, from_step: int = 0) -> float:
    cells = _block_cells(table, block, from_step)
    count = sum(c.count for c in cells)
    return sum(c.cosine_sum for c in cells) / count if count else math.nan


def _blocks_from(table: AccuracyTable, from_step: int) -> list[int]:
    return sorted({b for (step, b) in table.cells if step >= from_step})


def choose_block_sparsity(candidates: dict, cosine_floor: float, *, from_step: int = 0) -> dict[int, object]:
    """``{block: chosen spec, or None (dense)}`` for every block measured under a map: the candidate with the
    lowest ``tau`` whose mean cosine over the block's cells is at least ``cosine_floor``.

    ``candidates``: ``{top-p SparsitySpec: AccuracyTable}`` of one transformer (the cells measured under it).
    ``from_step``: only the cells of this step and later count (the earlier steps run dense).
    """
    if not -1.0 <= cosine_floor <= 1.0:
        raise ValueError(f"cosine_floor: expected a value in [-1, 1], got {cosine_floor}")
    blocks = sorted({b for table in candidates.values() for b in _blocks_from(table, from_step)})
    ranked = sorted(candidates.items(), key=lambda item: item[0].options["tau"])
    chosen = {}
    for block in blocks:
        chosen[block] = next((spec for spec, table in ranked
                              if _block_cosine(table, block, from_step) >= cosine_floor), None)
    return chosen


def block_sparsity_report(candidates: dict, *, from_step: int = 0) -> dict[int, dict[str, float]]:
    """``{block: {spec text: mean cosine}}`` of the candidates measured, over the steps from ``from_step`` (for the
    calibration summary)."""
    out: dict[int, dict[str, float]] = {}
    for spec, table in candidates.items():
        for block in _blocks_from(table, from_step):
            out.setdefault(block, {})[str(spec)] = _block_cosine(table, block, from_step)
    return out


def _denseness(spec) -> float:
    """How dense a block's choice is, to take the denser of two experts': dense above all, then a higher tau."""
    return 2.0 if spec is None else spec.options.get("tau", 1.0)


def choose_block_maps(sparse_tables: dict[str, dict], cosine_floor: float | None = None, *,
                      from_step: int = 0) -> dict[int, object]:
    """``{block: spec or None (dense)}`` for every block measured under a map at a step ``>= from_step``, over the
    transformers of ``sparse_tables`` (``{transformer: {candidate spec: AccuracyTable}}``): with a ``cosine_floor``
    (the candidates are top-p taus), :func:`choose_block_sparsity`; without, the one spec measured. A block index
    in two transformers (Wan2.2's experts) gets the denser of their choices."""
    chosen: dict[int, object] = {}
    for candidates in sparse_tables.values():
        if cosine_floor is not None:
            mine = choose_block_sparsity(candidates, cosine_floor, from_step=from_step)
        else:
            mine = {b: spec for spec, table in candidates.items() for b in _blocks_from(table, from_step)}
        for block, spec in mine.items():
            if block not in chosen or _denseness(spec) > _denseness(chosen[block]):
                chosen[block] = spec
    return chosen


def _sparse_cells(sparse_tables: dict[str, dict], block_maps: dict[int, object], from_step: int):
    """``((step, block), CellAccuracy)`` of every call left sparse: a step ``>= from_step``, measured under its
    block's chosen map."""
    for candidates in sparse_tables.values():
        for spec, table in candidates.items():
            for (step, block), acc in table.cells.items():
                if step >= from_step and block_maps.get(block) == spec:
                    yield (step, block), acc


def sparse_step_cosines(sparse_tables: dict[str, dict], block_maps: dict[int, object],
                        from_step: int = 0) -> dict[int, float]:
    """``{step: mean cosine}`` of the calls left sparse at each step from ``from_step`` (each block under its map
    in ``block_maps``; mean over blocks and prompts): the per-step fidelity of the sparse calls."""
    sums: dict[int, list[float]] = {}
    for (step, _), acc in _sparse_cells(sparse_tables, block_maps, from_step):
        row = sums.setdefault(step, [0.0, 0])
        row[0] += acc.cosine_sum
        row[1] += acc.count
    return {step: total / count for step, (total, count) in sorted(sums.items()) if count}


def block_map_measures(sparse_tables: dict[str, dict], block_maps: dict[int, object],
                       from_step: int = 0) -> dict[int, dict[str, float]]:
    """``{block: {"density", "kept_mass", "oracle_kept_mass"}}`` of each block's chosen map over the calls it runs
    (steps from ``from_step``, every transformer, every prompt): the map's mean density, the attention mass it
    keeps and the oracle's at the same per-row block counts (NaN where the masses were not measured). Blocks chosen
    dense are left out."""
    pooled: dict[int, CellAccuracy] = {}
    for (_, block), acc in _sparse_cells(sparse_tables, block_maps, from_step):
        pooled.setdefault(block, CellAccuracy()).merge(acc)
    return {b: {"density": acc.density, "kept_mass": acc.kept_mass, "oracle_kept_mass": acc.oracle_kept_mass}
            for b, acc in sorted(pooled.items())}


def expected_speedup(dense_tables: dict[str, AccuracyTable], sparse_tables: dict[str, dict],
                     block_maps: dict[int, object], from_step: int = 0, fp16_cells=()) -> float:
    """The expected attention speed-up of the block maps over the measured calls (every cell of ``dense_tables``
    once): a cell left sparse (step ``>= from_step``, its block's map measured there) costs the kernel's time at
    its mean density (:func:`rotvid.kernels.sparsity.cost.attention_speedup`), every other cell -- the dense first
    steps, dense blocks, blocks chosen dense, ``fp16_cells`` -- its dense time. 1.0 without maps."""
    sparse = {cell: acc.density for cell, acc in _sparse_cells(sparse_tables, block_maps, from_step)
              if acc.density_count}
    fp16 = set(fp16_cells)
    densities = [None if cell in fp16 else sparse.get(cell)
                 for table in dense_tables.values() for cell in table.cells]
    return attention_speedup(densities)


@dataclass(frozen=True)
class SparseChoice:
    """The dense first steps and block maps :func:`choose_sparse_schedule` chose.

    Attributes:
        dense_first_steps: the first steps that run dense.
        block_maps: ``{block: spec or None (dense)}``, chosen on the steps from ``dense_first_steps``.
        step_cosines: ``{step: mean cosine}`` of the calls left sparse (:func:`sparse_step_cosines`).
        floor_met: every step's mean cosine reaches the floor (None: no floor).
        speedup: the expected attention speed-up of the maps (:func:`expected_speedup`, FP16 cells not known yet).
        tried: ``{dense first steps: (worst step cosine, expected speed-up)}`` of every candidate (NaN: no sparse
            call left).
    """

    dense_first_steps: int
    block_maps: dict
    step_cosines: dict[int, float]
    floor_met: bool | None
    speedup: float
    tried: dict[int, tuple[float, float]]


def choose_sparse_schedule(dense_tables: dict[str, AccuracyTable], sparse_tables: dict[str, dict], *,
                           cosine_floor: float | None, dense_first_steps, tau_ladder: bool = False) -> SparseChoice:
    """Choose the dense first steps and each block's map together, from the probe's tables
    (``dense_tables``: ``{transformer: AccuracyTable}`` of the dense quantized calls; ``sparse_tables``:
    ``{transformer: {candidate spec: AccuracyTable}}``, measured at every step the candidates may leave sparse).

    For each candidate count ``d`` of ``dense_first_steps`` (an iterable of counts; one value: that count, given):

    1. the block maps are chosen on the calls of the steps from ``d`` (:func:`choose_block_maps`; with
       ``tau_ladder`` each block's lowest tau whose mean cosine reaches ``cosine_floor``, else dense);
    2. the per-step fidelity: at each step from ``d``, the mean cosine of its sparse calls under their maps
       (:func:`sparse_step_cosines`); ``d`` meets the floor when every step's reaches it (no floor: every ``d``);
    3. the expected speed-up of those maps (:func:`expected_speedup`, the cost line of
       :mod:`rotvid.kernels.sparsity.cost`).

    The choice: of the counts that meet the floor, the one of highest expected speed-up (ties: the fewest dense
    steps). So a floor the sparsest maps reach from step 0 gets no dense step (a dense step then only costs time),
    and a floor the first steps' sparse calls miss gets dense first steps where they let the later calls keep
    sparser maps (rather than every block dense). When no count meets the floor: the count whose worst step is best
    (ties: the fewest), ``floor_met`` False -- the FP16 cells then take the calls below the floor.
    """
    counts = sorted(set(dense_first_steps))
    if not counts or min(counts) < 0:
        raise ValueError(f"dense_first_steps: expected counts >= 0, got {dense_first_steps!r}")
    if cosine_floor is not None and not -1.0 <= cosine_floor <= 1.0:
        raise ValueError(f"cosine_floor: expected a value in [-1, 1], got {cosine_floor}")
    trials = {}
    for d in counts:
        maps = choose_block_maps(sparse_tables, cosine_floor if tau_ladder else None, from_step=d)
        steps = sparse_step_cosines(sparse_tables, maps, d)
        worst = min(steps.values(), default=math.nan)
        met = None if cosine_floor is None else all(c >= cosine_floor for c in steps.values())
        trials[d] = (maps, steps, met, worst, expected_speedup(dense_tables, sparse_tables, maps, d))
    meeting = [d for d in counts if trials[d][2] is not False]
    if meeting:
        best = min(meeting, key=lambda d: (-round(trials[d][4], 9), d))
    else:  # (no count meets it: every count has a sparse step, so a worst cosine)
        best = min(counts, key=lambda d: (-trials[d][3], d))
    maps, steps, met, _, speedup = trials[best]
    return SparseChoice(dense_first_steps=best, block_maps=maps, step_cosines=steps, floor_met=met, speedup=speedup,
                        tried={d: (t[3], t[4]) for d, t in trials.items()})


def dense_first_steps_candidates(num_steps: int, cap: int | None = None) -> range:
    """The dense-first-step counts :func:`choose_sparse_schedule` tries for a run of ``num_steps``: 0 up to ``cap``
    (None: a quarter of the steps, rounded up), never all the steps."""
    if cap is None:
        cap = math.ceil(num_steps / 4)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ValueError(f"max_dense_first_steps: expected a count >= 0, got {cap!r}")
    return range(0, max(0, min(cap, num_steps - 1)) + 1)


def effective_table(dense: AccuracyTable, candidates: dict, chosen: dict[int, object], *,
                    from_step: int = 0) -> AccuracyTable:
    """The accuracy of what each cell will run: the chosen spec's where it was measured at a step ``>= from_step``
    (the cells the sparsity rules leave sparse; ``from_step``: the schedule's dense first steps), the dense
    quantized accuracy elsewhere (and for blocks chosen dense)."""
    out = AccuracyTable(num_steps=dense.num_steps, num_blocks=dense.num_blocks)
    for (step, block), acc in dense.cells.items():
        spec = chosen.get(block)
        sparse = candidates[spec].cells.get((step, block)) if spec in candidates and step >= from_step else None
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
