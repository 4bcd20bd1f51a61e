"""The run report: what ran how, per block, and every fallback with its reason.

Three outcomes of a self-attention call:

* ``quantized`` — the configured recipe ran on a rotvid kernel backend (named in ``backends``);
* ``fp16`` — the schedule (or ``recipe="fp16"``) asked for FP16: the model's own attention ran
  on the same rotated tensors;
* ``fallback`` — the schedule asked for the quantized recipe but the call could not take it
  (a mask that is not a key-padding mask, a backend that cannot run the input, ...). It ran in
  FP16 and the reason is counted in ``fallbacks``. Never silent: each distinct reason is also
  logged once at WARNING level — except a call the CUDA kernel refused on a GPU
  (:data:`~rotvid.pipelines.runtime.GPU_FALLBACK`): those get one WARNING per run, saying how to fix it.

Besides the calls, the report counts the transformer forwards (per transformer; those outside a
tracked denoising run separately, with the rule they ran under), the diffusers cache each
transformer had enabled (its skipped calls are ``skipped_calls``), every forward whose output was
not finite (``redos``: the step, and whether the FP16 redo was finite; a redo that is not finite
either is the model's own), and ``notes`` from ``apply`` (e.g. a block-diagonal V/O Hadamard).

With a block map configured (``RotvidConfig(sparsity=...)``) the report also gives, per (block, step), the quantized
calls that ran with a map, their mean density (kept key blocks / all key blocks) and, for top-p maps, the mean
estimated dropped mass (the block-mean softmax estimate of the mass of the skipped blocks, per query tile). Static
maps (``radial``) choose blocks by position and have no such estimate: the report says so instead of a number.
With the kept mass measured (``RotvidConfig(measure_kept_mass=True)``, always for ``oracle`` maps) it also gives the
mean **kept mass** (the true attention mass of the blocks the maps kept, mean over query rows) and the mean
**oracle kept mass** (the best any map with the same per-row block counts keeps), per (block, step) and overall.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field

import torch

__all__ = ["RunReport", "BlockCounts", "SparseCell", "nothing_quantized_reason"]

logger = logging.getLogger(__name__)

# The reasons the runtime (rotvid.pipelines.runtime) records, which the report explains
UNTRACKED_RULE = "outside a tracked run: the schedule's block rules only (fp16_first_blocks / fp16_last_blocks)"
GPU_FALLBACK = "the CUDA kernel cannot take this call on the GPU, the model's own attention ran: "


# the CUDA backend's reasons that mean "no GPU here" (the reference is then the only choice, not a fallback)
_NO_GPU_REASONS = ("cuda: not installed", "cuda: no CUDA GPU", "cuda: inputs are on cpu")


# The way out, by the CUDA kernel's reason (first match wins), for the one warning per run.
_GPU_FIXES = (
    ("nvcc", "install a CUDA toolkit matching torch's CUDA {cuda} (nvcc on PATH, or CUDA_HOME set) for the first "
             "build of the kernels"),
    ("not installed", "install rotvid with its CUDA kernels (rotvid.kernels.cuda_backend)"),
    ("head_dim", "the kernels take head_dim 64 and 128 only: this model's other head_dims run its own attention"),
    ("dtype", "load the model in bf16 or fp16 (the kernels take those)"),
    ("has no CUDA kernel", "use recipe='auto' (the recipe with a kernel on this GPU)"),
    ("compute capability", "use a GPU the kernels support (`rotvid backends` lists them)"),
    ("sm", "use recipe='auto' (the recipe with a kernel on this GPU)"),
)


def gpu_fallback_fix(reason: str) -> str:
    """How to make the CUDA kernel take calls it refused for ``reason``."""
    for key, fix in _GPU_FIXES:
        if key in reason:
            return fix.format(cuda=torch.version.cuda)
    return "see the reason above"


def reference_fallback(backend: str) -> bool:
    """True for a backend record where ``auto`` ran the reference because the CUDA kernel refused a call on a GPU."""
    return backend.startswith("reference (auto;") and not any(r in backend for r in _NO_GPU_REASONS)


@dataclass
class BlockCounts:
    quantized: int = 0
    fp16: int = 0
    fallback: int = 0

    @property
    def total(self) -> int:
        return self.quantized + self.fp16 + self.fallback


# What the report says of the dropped mass, by which calls had an estimate
DROPPED_MASS_ESTIMATED = ("top-p's estimate: the block-mean softmax mass of the skipped key blocks, mean over query "
                          "tiles, heads and batch (for oracle maps the exact mass)")
DROPPED_MASS_NOT_ESTIMATED = ("not estimated: static maps (radial) choose key blocks by position, with no estimate of "
                              "the mass they drop")


@dataclass
class SparseCell:
    """The calls of one (block, step) that ran with a block map: how many, the sums of their densities and of
    their estimated dropped mass, and how many had an estimate (top-p maps; static maps have none)."""

    calls: float = 0.0
    density_sum: float = 0.0
    dropped_sum: float = 0.0
    estimated_calls: float = 0.0
    kept_sum: float = 0.0
    oracle_kept_sum: float = 0.0
    measured_calls: float = 0.0

    def add(self, sums) -> None:
        self.calls += sums.calls
        self.density_sum += sums.density_sum
        self.dropped_sum += sums.dropped_sum
        self.estimated_calls += sums.estimated_calls
        self.kept_sum += sums.kept_sum
        self.oracle_kept_sum += sums.oracle_kept_sum
        self.measured_calls += sums.measured_calls

    @property
    def kept_mass(self) -> float | None:
        """Mean true mass of the kept blocks over the calls whose kept mass was measured; None when none was."""
        return self.kept_sum / self.measured_calls if self.measured_calls else None

    @property
    def oracle_kept_mass(self) -> float | None:
        """Mean oracle kept mass (same per-row counts) over the measured calls; None when none was."""
        return self.oracle_kept_sum / self.measured_calls if self.measured_calls else None

    @property
    def density(self) -> float | None:
        return self.density_sum / self.calls if self.calls else None

    @property
    def dropped_mass(self) -> float | None:
        return self.dropped_sum / self.estimated_calls if self.estimated_calls else None


@dataclass
class RunReport:
    """Counts of self-attention calls since ``apply`` (or the last :meth:`reset`).

    The calls count on the device (:mod:`rotvid.pipelines.call_counts`, right under
    ``torch.compile``); read the report through ``handle.report``, which brings it up to date.

    Attributes:
        recipe: the quantized recipe that runs (``auto`` resolved).
        recipe_requested: the configured recipe (``auto`` or the recipe itself).
        recipe_reason: why ``recipe`` runs (the auto table's reason, or "as requested").
        backend_requested: the configured backend (``auto`` | ``reference`` | ``cuda``).
        per_block: ``{"<transformer>/<global block>": BlockCounts}``.
        fp16_reasons: ``{reason: count}`` for the planned FP16 calls (schedule rules).
        fallbacks: ``{reason: count}`` for the unplanned FP16 calls.
        backends: ``{backend selection as the dispatcher described it: count}``.
        forwards: ``{transformer: forwards}`` the pipeline (or caller) made, redos not included.
        untracked_forwards: ``{transformer: forwards}`` of them outside a tracked denoising run (they ran
            under :attr:`untracked_rule`).
        sites: ``{transformer: self-attentions}`` rotvid is installed on.
        caches: ``{transformer: diffusers cache config class}`` for the transformers with a cache enabled.
        redos: one ``{"transformer", "step", "num_steps", "finite_after_redo"}`` per forward whose output was not
            finite and that ran again with FP16 attention (``step`` None outside a tracked run).
        nonfinite_inputs: one ``{"transformer", "step"}`` per forward with a non-finite output *and* input (not
            redone: not rotvid's).
        notes: what ``apply`` adapted (e.g. a block-diagonal V/O Hadamard for a head_dim that is not a power of two).
        sparsity: the config's block map spec (text), ``"none"`` without one.
        schedule: the name of the config's schedule (``None`` for a hand-made one), for the summary's words.
        sparsity_rules: the schedule's sparsity rules (``dense_first_steps``, ``dense_blocks``, ``block_sparsity``).
        sparse_cells: ``{(site, step): SparseCell}`` for the calls that ran with a block map (``step`` None outside
            a tracked run).
    """

    recipe: str
    backend_requested: str
    recipe_requested: str | None = None
    recipe_reason: str = ""
    per_block: dict[str, BlockCounts] = field(default_factory=dict)
    fp16_reasons: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    backends: dict[str, int] = field(default_factory=dict)
    forwards: dict[str, int] = field(default_factory=dict)
    untracked_forwards: dict[str, int] = field(default_factory=dict)
    sites: dict[str, int] = field(default_factory=dict)
    caches: dict[str, str] = field(default_factory=dict)
    redos: list[dict] = field(default_factory=list)
    nonfinite_inputs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sparsity: str = "none"
    schedule: str | None = None
    sparsity_rules: dict = field(default_factory=dict)
    sparse_cells: dict[tuple[str, int | None], SparseCell] = field(default_factory=dict)
    _gpu_fallback_warned: bool = field(default=False, repr=False, compare=False)

    # ---- recording -----------------------------------------------------------------------
    def _block(self, site: str) -> BlockCounts:
        if site not in self.per_block:
            self.per_block[site] = BlockCounts()
        return self.per_block[site]

    def record_quantized(self, site: str, backend: str, n: int = 1) -> None:
        self._block(site).quantized += n
        if backend not in self.backends and reference_fallback(backend):
            logger.warning("rotvid: self-attention runs on the PyTorch reference (slow) at %s: %s", site, backend)
        self.backends[backend] = self.backends.get(backend, 0) + n

    def record_fp16(self, site: str, reason: str, n: int = 1) -> None:
        self._block(site).fp16 += n
        self.fp16_reasons[reason] = self.fp16_reasons.get(reason, 0) + n

    def record_fallback(self, site: str, reason: str, n: int = 1) -> None:
        self._block(site).fallback += n
        if reason.startswith(GPU_FALLBACK):
            if not self._gpu_fallback_warned:
                self._gpu_fallback_warned = True
                logger.warning("rotvid: %s (first at %s: %s). To fix: %s. (backend='reference' runs the recipe on the "
                               "slow PyTorch reference instead.)", GPU_FALLBACK.rstrip(": "), site,
                               reason[len(GPU_FALLBACK):], gpu_fallback_fix(reason))
        elif reason not in self.fallbacks:
            logger.warning("rotvid: self-attention falls back to FP16 at %s: %s", site, reason)
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + n

    def record_forward(self, transformer: str, *, tracked: bool, cache: str | None = None) -> None:
        """One forward of ``transformer`` (by the forward guard, outside any compiled graph)."""
        self.forwards[transformer] = self.forwards.get(transformer, 0) + 1
        if not tracked:
            self.untracked_forwards[transformer] = self.untracked_forwards.get(transformer, 0) + 1
        if cache is not None:
            self.caches[transformer] = cache

    def record_redo(self, transformer: str, step: int | None, num_steps: int | None, *, finite: bool) -> None:
        self.redos.append({"transformer": transformer, "step": step, "num_steps": num_steps,
                           "finite_after_redo": finite})

    def record_nonfinite_input(self, transformer: str, step: int | None) -> None:
        self.nonfinite_inputs.append({"transformer": transformer, "step": step})

    def record_sparse(self, site: str, step: int | None, sums) -> None:
        """Add the block-sparse calls of ``site`` at ``step`` (a :class:`~rotvid.pipelines.call_counts.SparseSums`)."""
        self.sparse_cells.setdefault((site, step), SparseCell()).add(sums)

    def record(self, site: str, outcome: str, detail: str, n: int = 1) -> None:
        """Count ``n`` calls of ``outcome`` (``quantized`` / ``fp16`` / ``fallback``) with its backend or reason."""
        recorders = {"quantized": self.record_quantized, "fp16": self.record_fp16, "fallback": self.record_fallback}
        if outcome not in recorders:
            raise ValueError(f"outcome: expected one of {', '.join(recorders)}, got {outcome!r}")
        recorders[outcome](site, detail, n)

    def reset(self) -> None:
        """Forget the counts (the ``sites`` and ``notes`` of ``apply`` stay)."""
        self.per_block.clear()
        self.fp16_reasons.clear()
        self.fallbacks.clear()
        self.backends.clear()
        self.forwards.clear()
        self.untracked_forwards.clear()
        self.caches.clear()
        self.redos.clear()
        self.nonfinite_inputs.clear()
        self.sparse_cells.clear()
        self._gpu_fallback_warned = False

    # ---- summaries -------------------------------------------------------------------------
    @property
    def total_calls(self) -> int:
        return sum(c.total for c in self.per_block.values())

    @property
    def quantized_calls(self) -> int:
        return sum(c.quantized for c in self.per_block.values())

    @property
    def fp16_calls(self) -> int:
        return sum(c.fp16 for c in self.per_block.values())

    @property
    def fallback_calls(self) -> int:
        return sum(c.fallback for c in self.per_block.values())

    @property
    def quantized_fraction(self) -> float:
        """Fraction of self-attention calls that ran the quantized recipe (0.0 when none ran)."""
        total = self.total_calls
        return self.quantized_calls / total if total else 0.0

    @property
    def int4_fraction(self) -> float:
        """Deprecated: the old name of :attr:`quantized_fraction` (kept for one version)."""
        warnings.warn("RunReport.int4_fraction is deprecated (it is the quantized fraction for every recipe): "
                      "use quantized_fraction", DeprecationWarning, stacklevel=2)
        return self.quantized_fraction

    @property
    def skipped_calls(self) -> int:
        """Self-attention calls the forwards (and redos) would have made but did not: skipped by a diffusers cache
        (first-block cache, pyramid attention broadcast, ...). 0 without a cache."""
        expected = sum(self.sites.get(t, 0) * n for t, n in self.forwards.items())
        expected += sum(self.sites.get(r["transformer"], 0) for r in self.redos)
        return max(0, expected - self.total_calls)

    @property
    def untracked_rule(self) -> str:
        return UNTRACKED_RULE

    # ---- block-sparse calls ------------------------------------------------------------------
    @property
    def sparsity_configured(self) -> bool:
        """Whether the run was configured with a block map (the config's, or a block's own in the schedule)."""
        return self.sparsity != "none" or bool(self.sparsity_rules.get("block_sparsity"))

    def _sparse_total(self) -> SparseCell:
        """Every (block, step) cell's sums in one cell."""
        total = SparseCell()
        for cell in self.sparse_cells.values():
            total.add(cell)
        return total

    @property
    def sparse_calls(self) -> int:
        """Quantized calls that ran with a block map."""
        return round(self._sparse_total().calls)

    @property
    def mean_density(self) -> float | None:
        """Mean density (kept key blocks / all) over the calls that ran with a map; None when none did."""
        return self._sparse_total().density

    @property
    def mean_dropped_mass(self) -> float | None:
        """Mean estimated dropped mass over the calls that had an estimate (top-p maps); None when none had."""
        return self._sparse_total().dropped_mass

    @property
    def kept_mass_calls(self) -> int:
        """Sparse calls whose kept mass was measured."""
        return round(self._sparse_total().measured_calls)

    @property
    def mean_kept_mass(self) -> float | None:
        """Mean true attention mass of the blocks the maps kept (mean over query rows per call), over the calls
        whose kept mass was measured (``measure_kept_mass``, ``oracle`` maps); None when none was."""
        return self._sparse_total().kept_mass

    @property
    def mean_oracle_kept_mass(self) -> float | None:
        """Mean kept mass of the oracle at the same per-row block counts as each measured call's map; None when
        none was measured."""
        return self._sparse_total().oracle_kept_mass

    def dropped_mass_note(self) -> str | None:
        """How the dropped mass was (or was not) estimated; None without sparse calls."""
        total = self._sparse_total()
        calls, estimated = total.calls, total.estimated_calls
        if not calls:
            return None
        if estimated >= calls:
            return DROPPED_MASS_ESTIMATED
        if not estimated:
            return DROPPED_MASS_NOT_ESTIMATED
        return (f"estimated for {round(estimated)} of {round(calls)} sparse calls ({DROPPED_MASS_ESTIMATED}); the "
                f"others ran static maps: {DROPPED_MASS_NOT_ESTIMATED}")

    def sparsity_dict(self) -> dict | None:
        """The ``sparsity`` entry of :meth:`to_dict` (None when no block map was configured)."""
        if not self.sparsity_configured:
            return None

        def order(item):
            (site, step), _ = item
            transformer, _, block = site.rpartition("/")
            return transformer, int(block) if block.isdigit() else -1, -1 if step is None else step

        return {
            "spec": self.sparsity,
            "rules": dict(self.sparsity_rules),
            "sparse_calls": self.sparse_calls,
            "dense_quantized_calls": max(0, self.quantized_calls - self.sparse_calls),
            "mean_density": self.mean_density,
            "mean_dropped_mass": self.mean_dropped_mass,
            "dropped_mass": self.dropped_mass_note(),
            "kept_mass_calls": self.kept_mass_calls,
            "mean_kept_mass": self.mean_kept_mass,
            "mean_oracle_kept_mass": self.mean_oracle_kept_mass,
            "per_block_step": [_cell_dict(site, step, cell)
                               for (site, step), cell in sorted(self.sparse_cells.items(), key=order)],
        }

    def to_dict(self) -> dict:
        return {
            "recipe": self.recipe,
            "recipe_requested": self.recipe_requested or self.recipe,
            "recipe_reason": self.recipe_reason,
            "backend_requested": self.backend_requested,
            "total_calls": self.total_calls,
            "quantized_calls": self.quantized_calls,
            "fp16_calls": self.fp16_calls,
            "fallback_calls": self.fallback_calls,
            "quantized_fraction": self.quantized_fraction,
            "backends": dict(self.backends),
            "fp16_reasons": dict(self.fp16_reasons),
            "fallbacks": dict(self.fallbacks),
            "per_block": {k: vars(v).copy() for k, v in self.per_block.items()},
            "forwards": dict(self.forwards),
            "untracked_forwards": dict(self.untracked_forwards),
            "untracked_rule": self.untracked_rule if self.untracked_forwards else None,
            "caches": dict(self.caches),
            "skipped_calls": self.skipped_calls,
            "redos": [dict(r) for r in self.redos],
            "nonfinite_inputs": [dict(r) for r in self.nonfinite_inputs],
            "notes": list(self.notes),
            "sparsity": self.sparsity_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"self-attention calls: {self.total_calls}  quantized ({self.recipe}): {self.quantized_calls} "
            f"({100 * self.quantized_fraction:.1f}%)  fp16 (planned): {self.fp16_calls}  "
            f"fallback: {self.fallback_calls}",
        ]
        if self.recipe_reason:
            lines.append(f"  recipe {self.recipe}: {self.recipe_reason}")
        for name, n in sorted(self.backends.items()):
            flag = "  (FALLBACK from the CUDA kernel: slow)" if reference_fallback(name) else ""
            lines.append(f"  backend {name}: {n} calls{flag}")
        for reason, n in sorted(self.fallbacks.items()):
            lines.append(f"  FALLBACK {n} calls: {reason}")
        untracked = sum(self.untracked_forwards.values())
        if untracked:
            lines.append(f"  {untracked} forwards {self.untracked_rule}")
        if self.caches:
            caches = ", ".join(f"{name}: {cache}" for name, cache in sorted(self.caches.items()))
            lines.append(f"  diffusers cache ({caches}): {self.skipped_calls} self-attention calls skipped")
        for r in self.redos:
            where = f"step {r['step']}" if r["step"] is not None else "outside a tracked run"
            verdict = "finite after the FP16 redo" if r["finite_after_redo"] else \
                "NOT finite in FP16 either: the model's own, not rotvid's"
            lines.append(f"  REDO {r['transformer']} at {where}: output not finite, ran again in FP16: {verdict}")
        for r in self.nonfinite_inputs:
            where = f"step {r['step']}" if r["step"] is not None else "outside a tracked run"
            lines.append(f"  {r['transformer']} at {where}: output and inputs not finite (not rotvid's; not redone)")
        if self.sparsity_configured:
            density = self.mean_density
            line = (f"  block maps ({self.sparsity}): {self.sparse_calls} of {self.quantized_calls} quantized calls"
                    + ("" if density is None else f", mean density {density:.3f}"))
            dropped = self.mean_dropped_mass
            if dropped is not None:
                line += f", mean estimated dropped mass {dropped:.4f}"
            elif self.sparse_calls:
                line += ", dropped mass not estimated (static maps)"
            kept, best = self.mean_kept_mass, self.mean_oracle_kept_mass
            if kept is not None:
                line += (f"; kept mass {kept:.4f} (oracle at the same density {best:.4f}, "
                         f"{self.kept_mass_calls} calls measured)")
            lines.append(line)
        for note in self.notes:
            lines.append(f"  note: {note}")
        why = nothing_quantized_reason(self.to_dict(), self.schedule, options=False)
        if why is not None:
            lines.append(f"  note: {why}")
        return "\n".join(lines)


def _cell_dict(site: str, step: int | None, cell: SparseCell) -> dict:
    """One ``per_block_step`` entry; the kept masses only where they were measured."""
    d = {"site": site, "step": step, "calls": round(cell.calls), "density": cell.density,
         "dropped_mass": cell.dropped_mass}
    if cell.measured_calls:
        d["kept_mass"] = cell.kept_mass
        d["oracle_kept_mass"] = cell.oracle_kept_mass
    return d


def nothing_quantized_reason(run_report: dict | None, schedule_name: str | None = None, *,
                             options: bool = True) -> str | None:
    """Why a run with a quantized recipe quantized no self-attention call, or ``None`` when some
    ran quantized (or nothing was asked to: the untouched reference has no run report).
    ``run_report``: :meth:`RunReport.to_dict`; ``schedule_name``: the schedule's name, for the message;
    ``options``: the way out in the CLI's words (``--schedule none``), else the Python API's (``schedule="none"``).

    E.g. ``0 of 8 self-attention calls quantized: the schedule paper-wan2.2-t2v keeps them in FP16
    (schedule: first 2 steps: 8 calls); ...``.
    """
    if not run_report or run_report.get("quantized_calls", 0) or not run_report.get("total_calls"):
        return None
    if run_report.get("recipe") == "fp16":  # --recipe fp16 with a rotation: FP16 was asked for
        return None
    total = run_report["total_calls"]
    parts = []
    planned = run_report.get("fp16_reasons") or {}
    if planned:
        detail = "; ".join(f"{r}: {n} calls" for r, n in sorted(planned.items()))
        parts.append(f"the schedule{' ' + schedule_name if schedule_name else ''} keeps them in FP16 ({detail})")
    fallbacks = run_report.get("fallbacks") or {}
    if fallbacks:
        parts.append("fallbacks to FP16 (" + "; ".join(f"{r}: {n} calls" for r, n in sorted(fallbacks.items())) + ")")
    hints = []
    if any("steps" in r for r in planned):
        hints.append("more --steps than the schedule keeps in FP16" if options else
                     "more num_inference_steps than the schedule keeps in FP16")
    if any("blocks" in r for r in planned):
        hints.append("a model with more blocks than the schedule keeps in FP16 (the paper's keep the first and "
                     "last two)")
    if planned:
        hints.append("--schedule none (every call quantized)" if options else
                     'schedule="none" (every call quantized)')
    why = " and ".join(parts) or "no call ran the quantized recipe"
    tail = f"; to quantize, use {' or '.join(hints)}" if hints else ""
    return f"0 of {total} self-attention calls quantized: {why}{tail}"
