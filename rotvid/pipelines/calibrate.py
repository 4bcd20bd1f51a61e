"""``rotvid calibrate``: learn per-block rotations and an adaptive FP16 schedule from a few prompts.

Two passes over the calibration prompts on the same pipeline:

1. **Capture** (FP16 attention, no rotation, no V/O Hadamard — so the pipeline computes exactly
   what it computes without rotvid): :class:`~rotvid.pipelines.capture.QKVCapture` records
   token-subsampled post-RoPE Q and smoothed K (and V) of every block at the chosen steps.
   Per block (optionally per head) the 2×2 blocks are learned
   (:func:`rotvid.pipelines.rotation_training.learn_rotation`, paper Eq. 9–10, initialized at H₂)
   and written to ``rotations.safetensors`` ([blocks, P] or [blocks, heads, P]; several
   transformers — Wan2.2's experts — are stacked one after the other).
2. **Probe** (the learned rotation installed, every call measured, none quantized for real):
   :class:`~rotvid.pipelines.capture.AccuracyProbe` measures the quantized recipe against FP16
   at every (step, block) and :mod:`rotvid.pipelines.adaptive_schedule` chooses the FP16 cells
   (cosine floor and/or target INT4 fraction), written to ``schedule.json``.

With a block map (``sparsity``, and the schedule's sparsity rules ``dense_first_steps`` / ``dense_blocks``) the
probe also measures the quantized attention under the map wherever the rules leave a call sparse, and the schedule
records the map of each measured block in ``block_sparsity``. For a top-p map with a ``cosine_floor``, the map of
each block is chosen: the lowest ``tau`` among the given one and the ladder above it
(:data:`~rotvid.pipelines.adaptive_schedule.TAU_LADDER`) whose mean cosine over the block's cells reaches the
floor, or dense when none does. With a ``cosine_floor`` and ``dense_first_steps`` not given, the dense first steps
are chosen with the maps (:func:`~rotvid.pipelines.adaptive_schedule.choose_sparse_schedule`: the probe then
measures the maps from step 0; of the counts 0 .. ``max_dense_first_steps`` whose sparse calls reach the floor at
every step, the one of highest expected speed-up). The FP16 cells are then chosen from the accuracy of what each cell
will run (its block's map where the rules leave it sparse, dense elsewhere). A block index with two experts (Wan2.2)
gets the denser of their two choices.

Per block the result reports the chosen map's density, the attention mass it keeps and the oracle's at the same
per-row block counts (exact block masses from full-precision scores, one pass per probed call), and for the whole
schedule the expected attention speed-up of the maps -- an estimate from the block-sparse kernel's time-vs-density
line measured on an NVIDIA H200 (:mod:`rotvid.kernels.sparsity.cost`), every call without a map counted dense.

``rotvid generate --rotation learned:calib/rotations.safetensors --schedule calib/schedule.json``
then uses both. The step indices in the schedule refer to a run with the same number of steps.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from rotvid.kernels.recipes import fp16
from rotvid.kernels.recipes.auto import resolve_recipe
from rotvid.kernels.sparsity import SparsitySpec, cost, parse_sparsity
from rotvid.pipelines.adaptive_schedule import (
    UNSET, AccuracyTable, SparseChoice, block_map_measures, block_sparsity_report, choose_fp16_cells,
    choose_sparse_schedule, dense_first_steps_candidates, effective_table, expected_speedup,
    renamed_target_fraction, tau_candidates, write_schedule,
)
from rotvid.pipelines.attach import _execution_device, apply, find_transformers, remove
from rotvid.pipelines.capture import TEXT_POSITION_BY_TOKEN_ORDER, AccuracyProbe, DumpSpec, QKVCapture, latent_grid
from rotvid.pipelines.config import RotvidConfig
from rotvid.pipelines.schedule import Schedule
from rotvid.pipelines.rotation_training import learn_rotation
from rotvid.rope.rotations import save_learned_rotation

logger = logging.getLogger(__name__)


@dataclass
class CalibrationOptions:
    """Knobs of :func:`calibrate` (the CLI's options map one to one).

    Attributes:
        pairing: ``"half"`` or ``"interleaved"``.
        per_head: learn one set of blocks per head (default: one per block).
        iters, lr: Adam iterations and learning rate per block.
        objective: ``"scores"`` (Eq. 9) or ``"output"`` (INT4 attention output error).
        unconstrained: learn general invertible blocks (the paper's ablation; the result is
            written to ``rotations_unconstrained.safetensors`` and cannot be installed).
        capture_steps: steps to capture (``None``: every step).
        max_tokens: tokens per call kept by the capture, and per block for learning.
        recipe, backend: what the probe measures (``recipe="auto"``: the GPU's recipe,
            :func:`rotvid.kernels.recipes.auto.resolve_recipe`).
        cosine_floor, target_quantized_fraction: the adaptive schedule's rules (at least one;
            ``target_quantized_fraction`` is 0.8 unless given). ``target_int4_fraction``, its old
            name, is still accepted for one version (``DeprecationWarning``).
        dump_dir: also write every captured call (batch row 0, full tensors) as a tensor dump
            for ``benchmarks/accuracy_study.py --dump``; needs ``video_size``.
        sparsity: the block map the schedule is chosen for (a spec or its text; ``none``: dense), with the
            schedule's sparsity rules ``dense_first_steps`` and ``dense_blocks`` (module docstring).
            ``dense_first_steps`` None: chosen with a map and a ``cosine_floor`` (from 0 up to
            ``max_dense_first_steps``, None: a quarter of the run's steps rounded up), else 0.
    """

    pairing: str = "half"
    per_head: bool = False
    iters: int = 200
    lr: float = 0.01
    objective: str = "scores"
    unconstrained: bool = False
    capture_steps: set[int] | None = None
    max_tokens: int = 1024
    recipe: str = "auto"
    backend: str = "auto"
    cosine_floor: float | None = None
    target_quantized_fraction: float | None = UNSET  # 0.8 unless given (resolved in __post_init__)
    seed: int = 0
    dump_dir: Path | None = None
    model_name: str = ""
    video_size: tuple[int, int, int] | None = None  # (height, width, frames), needed for dumps
    sparsity: SparsitySpec | str = "none"
    dense_first_steps: int | None = None  # None: chosen with a map and a cosine floor, else 0
    dense_blocks: tuple[int, ...] = ()
    max_dense_first_steps: int | None = None  # None: a quarter of the run's steps (rounded up)
    target_int4_fraction: InitVar[float | None] = UNSET  # the old name, accepted for one version

    def __post_init__(self, target_int4_fraction) -> None:
        # __post_init__ <- __init__ <- the caller: the warning points at the caller
        target = renamed_target_fraction(self.target_quantized_fraction, target_int4_fraction, stacklevel=4)
        self.target_quantized_fraction = 0.8 if target is UNSET else target
        self.sparsity = parse_sparsity(self.sparsity)
        Schedule(dense_first_steps=self.dense_first_steps or 0, dense_blocks=self.dense_blocks)  # (checks them)
        if self.max_dense_first_steps is not None:
            dense_first_steps_candidates(1, self.max_dense_first_steps)  # ValueError naming it

    @property
    def chooses_dense_first_steps(self) -> bool:
        """The dense first steps are chosen (a block map, a cosine floor, ``dense_first_steps`` not given)."""
        return self.dense_first_steps is None and self.sparsity.enabled and self.cosine_floor is not None

    def sparsity_schedule(self, dense_first_steps: int | None = None, **fields) -> Schedule:
        """A schedule with the sparsity rules of these options (``dense_first_steps`` given: that count, else the
        options', 0 when they leave it to the choice) and ``fields``."""
        if dense_first_steps is None:
            dense_first_steps = self.dense_first_steps or 0
        return Schedule(dense_first_steps=dense_first_steps, dense_blocks=tuple(self.dense_blocks), **fields)

    @property
    def taus(self) -> tuple[float, ...]:
        """The top-p taus the probe tries per block: the ladder from the spec's (with a cosine floor), else none."""
        spec = self.sparsity
        if not spec.enabled or spec.static or "tau" not in spec.options or self.cosine_floor is None:
            return ()
        return tau_candidates(spec.options["tau"])


@dataclass
class BlockResult:
    transformer: str
    block: int
    objective_init: float
    objective_final: float


@dataclass
class CalibrationResult:
    """What :func:`calibrate` wrote and measured."""

    rotations_path: Path
    schedule_path: Path
    blocks: list[BlockResult] = field(default_factory=list)
    fp16_cells: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    quantized_fraction: float = math.nan  # of the measured cells, run quantized by the schedule
    schedule: Schedule | None = None
    dumps: list[Path] = field(default_factory=list)
    recipe: str = ""  # the recipe the probe measured (``auto`` resolved)
    recipe_reason: str = ""
    block_sparsity: dict[int, str] = field(default_factory=dict)  # the map of each measured block ("none": dense)
    block_cosines: dict[int, dict[str, float]] = field(default_factory=dict)  # {block: {candidate spec: cosine}}
    # {block: {"density", "kept_mass", "oracle_kept_mass"}} of each block's chosen map (blocks with a map)
    block_map_measures: dict[int, dict[str, float]] = field(default_factory=dict)
    dense_first_steps: int = 0  # the schedule's
    dense_first_steps_rule: str = ""  # how it was set: "given", or the choice and the counts tried
    step_cosines: dict[int, float] = field(default_factory=dict)  # {step: mean cosine of its sparse calls}
    expected_speedup: float = math.nan  # of the block maps over the measured calls (cost line); NaN: no sparsity

    @property
    def mean_kept_mass(self) -> float:
        """Mean over the blocks with a map of the attention mass their map keeps (NaN: none)."""
        return _mean(row["kept_mass"] for row in self.block_map_measures.values())

    @property
    def mean_oracle_kept_mass(self) -> float:
        """Mean over the blocks with a map of the oracle's kept mass at the map's block counts (NaN: none)."""
        return _mean(row["oracle_kept_mass"] for row in self.block_map_measures.values())

    @property
    def int4_fraction(self) -> float:
        """Deprecated: the old name of :attr:`quantized_fraction` (kept for one version)."""
        warnings.warn("CalibrationResult.int4_fraction is deprecated (it is the quantized fraction for every "
                      "recipe): use quantized_fraction", DeprecationWarning, stacklevel=2)
        return self.quantized_fraction

    def summary_rows(self) -> list[dict]:
        return [
            {"transformer": b.transformer, "block": b.block, "objective_H2": b.objective_init,
             "objective_learned": b.objective_final}
            for b in self.blocks
        ]


def _finite(value: float) -> float | None:
    """``value``, or None for NaN (JSON has no NaN)."""
    return None if math.isnan(value) else value


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def _segments_of(pipe, transformer_name: str) -> tuple[int, ...] | None:
    from rotvid.pipelines.attach import _segments_for

    family, transformers = find_transformers(pipe)
    t = transformers[transformer_name]
    return _segments_for(family, t, int(t.config.attention_head_dim))


def calibrate(
    pipe,
    prompts: Iterable[str],
    out_dir: str | Path,
    *,
    call: Callable[[object, str], object],
    options: CalibrationOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> CalibrationResult:
    """Run both calibration passes on ``pipe`` and write ``rotations.safetensors`` + ``schedule.json``.

    Args:
        pipe: a diffusers pipeline rotvid supports (rotvid must not be applied to it).
        prompts: calibration prompts (a handful is enough).
        out_dir: output folder (created).
        call: ``call(pipe, prompt)`` runs one generation (same steps/size/seed as generation will).
        options: :class:`CalibrationOptions`.
        progress: optional callback for one-line progress messages.
    """
    opts = options or CalibrationOptions()
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: expected at least one calibration prompt")
    if opts.cosine_floor is None and opts.target_quantized_fraction is None:
        raise ValueError("cosine_floor, target_quantized_fraction: expected at least one of them")
    say = progress or (lambda msg: logger.info(msg))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    family, transformers = find_transformers(pipe)

    # Pass 1: capture Q/K/V exactly as the untouched model computes them.
    capture = QKVCapture(steps=opts.capture_steps, max_tokens=opts.max_tokens, seed=opts.seed,
                         dump=_dump_spec(pipe, family, transformers, opts))
    config = RotvidConfig(recipe=fp16.RECIPE.name, rotation="none", vo_hadamard="off", backend="reference")
    _run_observed(pipe, config, capture, prompts, call, say, "capture")

    # Learn per block.
    result_blocks: list[BlockResult] = []
    angles_all, reflect_all, unconstrained_blocks = [], [], []
    segments = None
    for tname, transformer in transformers.items():
        head_dim = int(transformer.config.attention_head_dim)
        segments = _segments_of(pipe, tname) if opts.pairing == "half" else None
        num_blocks = sum(len(getattr(transformer, s.attr)) for s in family.stacks)
        for block in range(num_blocks):
            q, k, v = capture.tensors(tname, block, max_tokens=opts.max_tokens)
            res = learn_rotation(
                q, k, v=v, objective=opts.objective, pairing=opts.pairing, segments=segments,
                per_head=opts.per_head, iters=opts.iters, lr=opts.lr, unconstrained=opts.unconstrained, seed=opts.seed,
            )
            say(f"{tname} block {block}: objective {res.objective_init:.4g} (H2) -> {res.objective_final:.4g}")
            result_blocks.append(BlockResult(tname, block, res.objective_init, res.objective_final))
            if opts.unconstrained:
                unconstrained_blocks.append(res.blocks.detach())
            else:
                angles_all.append(res.angles.detach().reshape(-1, head_dim // 2).squeeze(0))
                reflect_all.append(res.reflect.reshape(-1, head_dim // 2).squeeze(0))

    if opts.unconstrained:
        from rotvid.rope.dumps import save_safetensors_atomically

        path = out / "rotations_unconstrained.safetensors"
        save_safetensors_atomically({"blocks": torch.stack(unconstrained_blocks).float().contiguous()}, path,
                                    {"pairing": opts.pairing, "head_dim": str(head_dim), "kind": "unconstrained"})
        result = CalibrationResult(rotations_path=path, schedule_path=out / "schedule.json", blocks=result_blocks,
                                   dumps=list(capture.dumps_written))
        _write_summary(out, result, opts)
        return result

    rot_path = out / "rotations.safetensors"
    save_learned_rotation(  # (atomic itself)
        rot_path, torch.stack(angles_all), torch.stack(reflect_all), pairing=opts.pairing, head_dim=head_dim,
        segments=segments,
    )

    # Pass 2: probe the quantized recipe with the learned rotation at every (step, block).
    recipe, recipe_reason = resolve_recipe(opts.recipe, _execution_device(pipe, transformers))
    say(f"probe recipe: {recipe} ({recipe_reason})")
    probe = AccuracyProbe(recipe=recipe, backend=opts.backend, taus=opts.taus)
    config = RotvidConfig(recipe=fp16.RECIPE.name, rotation=f"learned:{rot_path}", vo_hadamard="off",
                          backend=opts.backend, sparsity=opts.sparsity, schedule=opts.sparsity_schedule())
    if opts.sparsity.enabled:
        taus = f" (tau per block among {', '.join(map(str, opts.taus))})" if opts.taus else ""
        say(f"probe block map: {opts.sparsity}{taus}")
    _run_observed(pipe, config, probe, prompts, call, say, "probe")

    choice, rule = _choose_sparse_schedule(probe, opts)
    block_maps, dense_first = choice.block_maps, choice.dense_first_steps
    block_cosines: dict[int, dict[str, float]] = {}
    for candidates in probe.sparse_tables.values():
        for block, row in block_sparsity_report(candidates, from_step=dense_first).items():
            block_cosines.setdefault(block, {}).update(row)
    if opts.sparsity.enabled:
        say(f"dense first steps: {dense_first} ({rule})")
    cells: dict[str, list[tuple[int, int]]] = {}
    merged_cells: list[tuple[int, int]] = []
    effective: dict[str, AccuracyTable] = {}
    total = quant = 0
    for tname, table in probe.tables.items():
        table = effective[tname] = effective_table(table, probe.sparse_tables.get(tname, {}), block_maps,
                                                     from_step=dense_first)
        chosen = choose_fp16_cells(table, cosine_floor=opts.cosine_floor, target_quantized_fraction=opts.target_quantized_fraction)
        cells[tname] = chosen
        merged_cells.extend(chosen)
        n = len(table.cells)
        total, quant = total + n, quant + n - len(chosen)
    block_sparsity = tuple((b, spec if spec is not None else SparsitySpec()) for b, spec in sorted(block_maps.items()))
    accuracy = _merge_tables(effective)
    schedule = opts.sparsity_schedule(dense_first, fp16_cells=tuple(sorted(set(merged_cells))),
                                      block_sparsity=block_sparsity, name="calibrated",
                                      num_steps=accuracy.num_steps if accuracy is not None else None)  # its cells are of this run
    sched_path = write_schedule(schedule, out / "schedule.json", accuracy=accuracy)
    result = CalibrationResult(
        rotations_path=rot_path, schedule_path=sched_path, blocks=result_blocks, fp16_cells=cells,
        quantized_fraction=quant / total if total else math.nan, schedule=schedule, dumps=list(capture.dumps_written),
        recipe=recipe, recipe_reason=recipe_reason, block_sparsity={b: str(spec) for b, spec in block_sparsity},
        block_cosines=block_cosines,
    )
    if opts.sparsity.enabled:
        result.block_map_measures = block_map_measures(probe.sparse_tables, block_maps, dense_first)
        result.dense_first_steps, result.dense_first_steps_rule = dense_first, rule
        result.step_cosines = choice.step_cosines
        result.expected_speedup = expected_speedup(probe.tables, probe.sparse_tables, block_maps, dense_first,
                                                   fp16_cells=merged_cells)
    _write_summary(out, result, opts)
    return result


def _choose_sparse_schedule(probe: AccuracyProbe, opts: CalibrationOptions) -> tuple[SparseChoice, str]:
    """The dense first steps and block maps (:func:`~rotvid.pipelines.adaptive_schedule.choose_sparse_schedule`),
    with a line saying how the dense first steps were set."""
    tau_ladder = bool(opts.taus)
    if not opts.chooses_dense_first_steps:
        given = opts.dense_first_steps or 0
        choice = choose_sparse_schedule(probe.tables, probe.sparse_tables, cosine_floor=opts.cosine_floor,
                                        dense_first_steps=(given,), tau_ladder=tau_ladder)
        return choice, "given" if opts.dense_first_steps is not None else "not chosen: no cosine floor"
    num_steps = max((t.num_steps for t in probe.tables.values()), default=1)
    counts = dense_first_steps_candidates(num_steps, opts.max_dense_first_steps)
    choice = choose_sparse_schedule(probe.tables, probe.sparse_tables, cosine_floor=opts.cosine_floor,
                                    dense_first_steps=counts, tau_ladder=tau_ladder)
    if choice.floor_met:
        how = f"every step's sparse calls reach the cosine floor {opts.cosine_floor}"
    else:
        how = f"no count reaches the cosine floor {opts.cosine_floor} at every step: the best worst step"
    return choice, f"chosen among {counts.start}..{counts.stop - 1}: {how}"


def _run_observed(pipe, config: RotvidConfig, observer, prompts, call, say, label: str) -> None:
    """Run every prompt with rotvid applied under ``config`` and ``observer`` on its runtime (an observer with a
    ``runtime`` attribute is given it: the probe reads the block maps and the sparsity rules there)."""
    handle = apply(pipe, config)
    if hasattr(observer, "runtime"):
        observer.runtime = handle.runtime
    handle.runtime.observers.append(observer)
    try:
        for i, prompt in enumerate(prompts):
            say(f"{label} {i + 1}/{len(prompts)}: {prompt[:60]}")
            call(pipe, prompt)
    finally:
        remove(pipe)


def _dump_spec(pipe, family, transformers, opts: CalibrationOptions) -> DumpSpec | None:
    """Where the capture writes tensor dumps (``opts.dump_dir``), with the token grid of the run."""
    if opts.dump_dir is None:
        return None
    if opts.video_size is None:
        raise ValueError("video_size: dumps need the (height, width, frames) of the calibration runs")
    height, width, frames = opts.video_size
    grid = latent_grid(pipe, next(iter(transformers.values())), height=height, width=width, frames=frames)
    return DumpSpec(Path(opts.dump_dir), model=opts.model_name or type(pipe).__name__, family=family.rope_family,
                    grid=grid, text_position=TEXT_POSITION_BY_TOKEN_ORDER[family.token_order])


def _merge_tables(tables: dict[str, AccuracyTable]) -> AccuracyTable | None:
    """One table for the schedule file (experts run disjoint steps, so their cells do not collide)."""
    if not tables:
        return None
    first = next(iter(tables.values()))
    merged = AccuracyTable(num_steps=first.num_steps, num_blocks=first.num_blocks)
    for table in tables.values():
        for key, acc in table.cells.items():
            merged.cells.setdefault(key, type(acc)()).merge(acc)
    return merged


def _write_summary(out: Path, result: CalibrationResult, opts: CalibrationOptions) -> None:
    payload = {
        "version": 1,
        "options": {k: (sorted(v) if isinstance(v, set) else v) for k, v in opts.__dict__.items()},
        "rotations": str(result.rotations_path),
        "schedule": str(result.schedule_path) if result.schedule is not None else None,
        "blocks": result.summary_rows(),
        "fp16_cells": {k: [list(c) for c in v] for k, v in result.fp16_cells.items()},
        "quantized_fraction": result.quantized_fraction,
        "int4_fraction": result.quantized_fraction,  # the old name, kept for one version
        "recipe": result.recipe,
        "recipe_reason": result.recipe_reason,
        "block_sparsity": {str(b): spec for b, spec in result.block_sparsity.items()},
        "block_cosines": {str(b): row for b, row in result.block_cosines.items()},
        "block_map_measures": {str(b): {k: _finite(v) for k, v in row.items()}
                               for b, row in result.block_map_measures.items()},
        "mean_kept_mass": _finite(result.mean_kept_mass),
        "mean_oracle_kept_mass": _finite(result.mean_oracle_kept_mass),
        "dense_first_steps": result.dense_first_steps,
        "dense_first_steps_rule": result.dense_first_steps_rule,
        "step_cosines": {str(s): c for s, c in result.step_cosines.items()},
        "expected_speedup": _finite(result.expected_speedup),
        "expected_speedup_basis": cost.ESTIMATE_BASIS,
    }
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(out / "summary.json")
