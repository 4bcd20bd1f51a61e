"""Per-call outcome counters that stay right under ``torch.compile`` (and CUDA graphs).

Why not count in Python, as a plain ``dict`` incremented by each call? Because a compiled
graph does not run Python per call: dynamo reads the current count while tracing, bakes it in as
a constant and guards on it, so every call would recompile (or, past the recompile limit, stop
being compiled), and a CUDA-graph replay runs no Python at all. Counting *outside* the graph
(a forward hook) does not work either: ``torch.compile(transformer)`` traces the module's hooks
too, and the data-dependent outcome of a call (a mask that is not a key-padding mask) is only
known on the device.

So every self-attention call adds 1 to one slot of a small int64 counter tensor that lives on its
attention module (a non-persistent buffer, :data:`COUNTS_BUFFER`: it follows ``.to()`` and
offloading, and is not saved in the state dict). The *meaning* of each slot — ``(outcome,
detail)``, e.g. ``("fp16", "schedule: first 2 steps")`` — is registered in Python by
:func:`outcome_slot`, which ``torch.compile`` runs once while tracing and treats as a constant
(``torch.compiler.assume_constant_result``); in eager mode it is an ordinary call. The graph then
holds only ``counts[slot] += 1`` (or ``+= flag`` for a data-dependent outcome), which eager,
compiled and CUDA-graph runs all execute. The same code runs in eager and compiled mode.

:meth:`SiteCounters.drain` moves the counts into the :class:`~rotvid.pipelines.report.RunReport`
(one device-to-host copy per device, then the buffers are zeroed). The handle drains at every
denoising-step boundary and whenever its ``report`` is read, so a fallback is logged (WARNING,
once per reason, by the report) at the latest one step after it happened.

Block-sparse calls are summed the same way, in a second buffer per site (:data:`SPARSE_BUFFER`, float64
``[calls with a map, sum of their densities, sum of their estimated dropped mass, calls with an estimate, sum of
their kept mass, sum of the oracle's kept mass at the same counts, calls with a kept mass measured]``): the density
and the masses are device values of the call, added without a host sync.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "COUNTS_BUFFER", "PLANNED_BUFFER", "SPARSE_BUFFER", "SLOTS_PER_SITE", "OUTCOMES", "SiteCounters", "SparseSums",
    "outcome_slot",
]

COUNTS_BUFFER = "rotvid_call_counts"
# Sums over the calls that ran with a block map: [calls, density sum, dropped-mass sum, calls with an estimate,
# kept-mass sum, oracle kept-mass sum, calls with a kept mass measured].
SPARSE_BUFFER = "rotvid_sparse_stats"
# The site's entry of the current plan as data (True: FP16), for schedules with many distinct plans.
PLANNED_BUFFER = "rotvid_fp16_planned"
# Distinct (outcome, detail) pairs one self-attention can record: a few schedule reasons, one
# backend, a few fallback reasons. Exceeding it is an error, not a silent drop.
SLOTS_PER_SITE = 32
OUTCOMES = ("quantized", "fp16", "fallback")

# Installed sites by a process-unique integer: what the compiled graph passes to outcome_slot, since
# dynamo (torch 2.11) can hand an assume_constant_result function only Python constants, not objects.
_SITES: "weakref.WeakValueDictionary[int, SiteCounters]" = weakref.WeakValueDictionary()
_NEXT_ID = itertools.count()


@dataclass(frozen=True)
class SparseSums:
    """What one site's :data:`SPARSE_BUFFER` held: calls that ran with a block map, the sum of their densities,
    the sum of their estimated dropped mass and how many calls had an estimate (a static map has none), and, for
    the calls whose kept mass was measured (``measure_kept_mass``, ``oracle`` maps), the sums of their kept mass and
    of the oracle's kept mass at the same per-row counts, and how many."""

    calls: float
    density_sum: float
    dropped_sum: float
    estimated_calls: float
    kept_sum: float = 0.0
    oracle_kept_sum: float = 0.0
    measured_calls: float = 0.0


@dataclass
class SiteCounters:
    """The counter tensor of one self-attention and the meaning of its slots.

    Also holds the site's planned-FP16 flag (a 0-d bool buffer, :data:`PLANNED_BUFFER`), which the
    runtime sets at each step when the plan is passed to the graph as data.

    Attributes:
        key: the site's report key (``"<transformer>/<global block>"``).
        module: the attention module holding the :data:`COUNTS_BUFFER` buffer.
        slots: ``{(outcome, detail): slot index}``, in order of first use.
    """

    key: str
    module: nn.Module
    slots: dict[tuple[str, str], int] = field(default_factory=dict)
    uid: int = field(default_factory=lambda: next(_NEXT_ID))

    def __post_init__(self) -> None:
        _SITES[self.uid] = self

    @classmethod
    def install(cls, key: str, module: nn.Module) -> "SiteCounters":
        """Register a zeroed counter buffer on ``module`` (on its parameters' device)."""
        if hasattr(module, COUNTS_BUFFER):
            raise ValueError(f"pipe: {key} already has a {COUNTS_BUFFER!r} buffer (rotvid applied twice?)")
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        # A normal tensor even when apply runs under inference_mode: the pipeline (no_grad) updates it.
        with torch.inference_mode(False):
            counts = torch.zeros(SLOTS_PER_SITE, dtype=torch.int64, device=device)
            planned = torch.zeros((), dtype=torch.bool, device=device)
            sparse = torch.zeros(7, dtype=torch.float64, device=device)
        module.register_buffer(COUNTS_BUFFER, counts, persistent=False)
        module.register_buffer(PLANNED_BUFFER, planned, persistent=False)
        module.register_buffer(SPARSE_BUFFER, sparse, persistent=False)
        return cls(key, module)

    def uninstall(self) -> None:
        # (as register_buffer left them: the module as before)
        for name in (COUNTS_BUFFER, PLANNED_BUFFER, SPARSE_BUFFER):
            self.module._buffers.pop(name, None)
            self.module._non_persistent_buffers_set.discard(name)

    @property
    def planned(self) -> torch.Tensor:
        """0-d bool: the plan keeps this site in FP16 at the current step (set outside the graph)."""
        return getattr(self.module, PLANNED_BUFFER)

    def set_planned(self, fp16: bool) -> None:
        self.planned.fill_(fp16)

    @property
    def counts(self) -> torch.Tensor:
        return getattr(self.module, COUNTS_BUFFER)

    def add(self, outcome: str, detail: str, amount: torch.Tensor | int = 1) -> None:
        """Count ``amount`` calls (an int, or a 0-d integer/bool tensor computed on the device)."""
        slot = outcome_slot(self.uid, outcome, detail)
        counts = self.counts
        if isinstance(amount, torch.Tensor):
            counts[slot] += amount.to(counts.dtype)
        else:
            counts[slot] += amount

    @property
    def sparse(self) -> torch.Tensor:
        return getattr(self.module, SPARSE_BUFFER)

    def add_sparse(self, density: torch.Tensor, dropped_mass: torch.Tensor | None,
                   amount: torch.Tensor | int = 1, *, kept_mass: torch.Tensor | None = None,
                   oracle_kept_mass: torch.Tensor | None = None) -> None:
        """Add ``amount`` calls (an int, or a 0-d bool/int device value) that ran with a map of ``density``
        (0-d) and, for a dynamic map, the estimated ``dropped_mass`` (0-d; None for a static map); ``kept_mass`` /
        ``oracle_kept_mass`` (0-d, both or neither): the map's measured kept mass and the oracle's at the same
        counts."""
        sums = self.sparse
        one = torch.ones((), dtype=sums.dtype, device=sums.device)
        zero = torch.zeros((), dtype=sums.dtype, device=sums.device)
        estimated = dropped_mass is not None
        measured = kept_mass is not None and oracle_kept_mass is not None
        row = torch.stack([one, density.to(sums.dtype), dropped_mass.to(sums.dtype) if estimated else zero,
                           one if estimated else zero,
                           kept_mass.to(sums.dtype) if measured else zero,
                           oracle_kept_mass.to(sums.dtype) if measured else zero,
                           one if measured else zero])
        sums += row * (amount.to(sums.dtype) if isinstance(amount, torch.Tensor) else float(amount))

    @staticmethod
    def drain_sparse(sites: list["SiteCounters"]) -> dict[str, SparseSums]:
        """``{site key: SparseSums}`` for the sites with sparse calls since the last drain, then zero the sums
        (one device-to-host copy per device; not inside a compiled region)."""
        by_device: dict[torch.device, list[SiteCounters]] = {}
        for site in sites:
            by_device.setdefault(site.sparse.device, []).append(site)
        out = {}
        for group in by_device.values():
            stacked = torch.stack([s.sparse for s in group]).cpu()
            for site, row in zip(group, stacked.tolist()):
                if row[0]:
                    out[site.key] = SparseSums(*row)
                    site.sparse.zero_()
        return out

    @staticmethod
    def drain(sites: list["SiteCounters"], sink) -> None:
        """Call ``sink(site_key, outcome, detail, n)`` for every non-zero slot, then zero the counters.

        Not to be called inside a compiled region (it copies to the host).
        """
        by_device: dict[torch.device, list[SiteCounters]] = {}
        for site in sites:
            if site.slots:
                by_device.setdefault(site.counts.device, []).append(site)
        for group in by_device.values():
            stacked = torch.stack([s.counts for s in group]).cpu()
            for site, row in zip(group, stacked.tolist()):
                for (outcome, detail), slot in site.slots.items():
                    if row[slot]:
                        sink(site.key, outcome, detail, row[slot])
                site.counts.zero_()


@torch.compiler.assume_constant_result
def outcome_slot(site_uid: int, outcome: str, detail: str) -> int:
    """The slot of ``(outcome, detail)`` in the counters of the site numbered ``site_uid``
    (:attr:`SiteCounters.uid`), registering it on first use.

    Under ``torch.compile`` this runs while tracing and its result is a constant of the graph; its
    arguments are plain constants (an int and two strings), which every dynamo version accepts.
    """
    site = _SITES.get(site_uid)
    if site is None:
        raise RuntimeError(f"rotvid: no installed call counters numbered {site_uid} (removed while running?)")
    key = (outcome, detail)
    slot = site.slots.get(key)
    if slot is None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}")
        if len(site.slots) >= SLOTS_PER_SITE:
            raise RuntimeError(
                f"rotvid: {site.key} recorded more than {SLOTS_PER_SITE} distinct outcomes "
                f"({sorted(site.slots)}); raise rotvid.pipelines.call_counts.SLOTS_PER_SITE"
            )
        slot = len(site.slots)
        site.slots[key] = slot
    return slot
