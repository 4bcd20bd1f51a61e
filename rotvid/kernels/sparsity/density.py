"""Maps at a chosen density: the parameter of a kind whose density is not its parameter, chosen so that the kind's
maps keep a given fraction of the key blocks -- for comparing kinds at equal density. ``oracle:D`` keeps ``D`` by
construction; ``radial``'s window and ``topp``'s tau set the density only indirectly.

Density is :meth:`BlockMap.density() <rotvid.kernels.sparsity.block_map.BlockMap.density>`'s: kept blocks over all
``Tq · Tk`` blocks of a call, and for several calls the mean of the calls' densities (as the run report's
``mean_density``).

* :func:`radial_density` / :func:`radial_for_density`: a radial map depends on the token grid alone, so its
  density is known exactly before any call. With the band and ``decay`` fixed, every frame pair's radius grows
  with the window, so the density does too; :func:`radial_for_density` scans, for each band it is given, the
  windows ``0 .. max(height, width)`` (past the frame's larger side nothing changes: window ``none`` is that side)
  and returns the (band, window) whose density is closest to the target.
* :func:`topp_density` / :func:`topp_tau_for_density`: a top-p map depends on each call's Q and K, so its density
  is a mean over calls. From the estimates of some calls (:func:`~rotvid.kernels.sparsity.topp.topp_estimate`, e.g.
  of every call of a dense run of the same model, size and prompts), ``tau`` is bisected on a grid of step
  ``resolution`` (a short number in the spec) until the mean density of those calls' maps is closest to the target;
  the maps are recomputed from the estimates (:func:`~rotvid.kernels.sparsity.topp.topp_keep`: no second pooling,
  exactly the builder's rule). The density grows with ``tau`` (a larger ``tau`` keeps a superset). A run whose calls
  differ (a sparse run drifts from the dense one it was matched on) keeps a somewhat different density at that
  ``tau``: a study reports the density each run had.
* :func:`pmin_for_density`: the same for the ``pmin`` kind's threshold (the same estimates; a larger threshold keeps
  a subset), bisected on a geometric grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rotvid.kernels.sparsity.grid import TokenGrid
from rotvid.kernels.sparsity.radial import radial_block_mask
from rotvid.kernels.sparsity.spec import SparsitySpec
from rotvid.kernels.sparsity.topp import DEFAULT_SIM, TopPEstimate, pmin_keep, topp_keep

__all__ = ["pmin_for_density", "radial_density", "radial_for_density", "topp_density", "topp_tau_for_density"]


def _check_density(density) -> float:
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise ValueError(f"density: expected a fraction in (0, 1], got {density!r}")
    return float(density)


def radial_density(grid: TokenGrid, *, band: int = 1, window: int | None = None, decay: float = 0.5) -> float:
    """The density of the radial map of ``grid`` with these parameters (exact; the map's blocks from
    :func:`~rotvid.kernels.sparsity.radial.radial_block_mask`)."""
    return float(radial_block_mask(grid, band=band, window=window, decay=decay).float().mean())


def radial_for_density(grid: TokenGrid, density: float, *, bands: Sequence[int] = (1,),
                       decay: float = 0.5) -> tuple[SparsitySpec, float]:
    """``(spec, its density)``: the radial spec with ``decay``, a band of ``bands`` and the window that give ``grid``
    the density closest to ``density`` (ties: the band listed first, then the smaller window). With one band the
    achievable densities are a handful of steps (a window per token of radius), from the temporal band alone
    (window 0) to the densest window; more bands fill the gaps and reach further (band 1, Radial Attention's rule,
    alone stops near 0.6 on a 17-frame grid). A target outside them all gets the nearest end."""
    target = _check_density(density)
    if not bands:
        raise ValueError("bands: expected at least one temporal band")
    best: tuple[int, int, float] | None = None
    for band in bands:
        if isinstance(band, bool) or not isinstance(band, int) or band < 0:
            raise ValueError(f"bands: expected ints >= 0, got {band!r}")
        for window in range(max(grid.height, grid.width) + 1):
            d = radial_density(grid, band=band, window=window, decay=decay)
            if best is None or abs(d - target) < abs(best[2] - target):
                best = (band, window, d)
            if d >= target:  # (the density only grows with the window: every later one is farther)
                break
    band, window, d = best
    return SparsitySpec("radial", {"band": band, "window": window, "decay": decay}), d


def _stacked(estimates: Sequence[TopPEstimate]) -> list[tuple[int, tuple]]:
    """The estimates' fields concatenated over calls of the same shape: ``[(calls, (mass, q_sim, k_sim, k_live))]``
    with every call's batch rows kept apart (a call's density is the mean over its own rows)."""
    groups: dict[tuple, list[TopPEstimate]] = {}
    for est in estimates:
        if not isinstance(est, TopPEstimate):
            raise ValueError(f"estimates: expected TopPEstimate values (topp_estimate), got {type(est).__name__}")
        groups.setdefault((tuple(est.mass.shape), est.mass.device), []).append(est)
    out = []
    for (shape, _), group in groups.items():
        b = shape[0]
        fields = (
            torch.cat([e.mass for e in group]),
            torch.cat([e.q_sim for e in group]),
            torch.cat([e.k_sim for e in group]),
            torch.cat([e.k_live.expand(b, *e.k_live.shape[1:]) for e in group]),
        )
        out.append((len(group), fields))
    return out


def _mean_density(stacked: list[tuple[int, tuple]], value: float, sim: float, *, kind: str = "topp") -> float:
    """The mean density of the calls' maps of ``kind`` at its parameter ``value``: ``topp``'s tau or ``pmin``'s
    threshold."""
    total, calls = 0.0, 0
    for n, (mass, q_sim, k_sim, k_live) in stacked:
        if kind == "pmin":
            keep = pmin_keep(mass, q_sim, k_sim, k_live, pmin=value, sim=sim)
        else:
            keep = topp_keep(mass, q_sim, k_sim, k_live, tau=value, sim=sim)
        per_call = keep.view(n, -1).float().mean(dim=-1)  # (each call's rows are contiguous in the batch)
        total += float(per_call.sum())
        calls += n
    return total / calls


def topp_density(estimates: Sequence[TopPEstimate], tau: float, *, sim: float = DEFAULT_SIM) -> float:
    """The mean density of the top-p maps ``topp:tau,sim=sim`` of the calls whose estimates are given."""
    if not estimates:
        raise ValueError("estimates: expected the estimates of at least one call, got none")
    return _mean_density(_stacked(estimates), tau, sim)


def topp_tau_for_density(estimates: Sequence[TopPEstimate], density: float, *, sim: float = DEFAULT_SIM,
                         resolution: float = 1e-4) -> tuple[float, float]:
    """``(tau, mean density)``: the ``tau`` on the grid ``resolution, 2·resolution, ..., 1`` whose top-p maps (with
    ``sim``) give the calls of ``estimates`` the mean density closest to ``density`` (module docstring; ties: the
    smaller tau). A target above the density at ``tau = 1`` gets ``tau = 1``; one below what the blocks top-p always
    keeps (the diagonal, the blocks below ``sim``) gets the smallest tau."""
    target = _check_density(density)
    if not estimates:
        raise ValueError("estimates: expected the estimates of at least one call, got none")
    if not 0 < resolution <= 1:
        raise ValueError(f"resolution: expected a step in (0, 1], got {resolution!r}")
    stacked = _stacked(estimates)
    steps = math.floor(1 / resolution + 1e-9)

    def tau_of(i: int) -> float:
        return 1.0 if i >= steps else round(i * resolution, 12)

    lo, hi = 0, steps  # invariant: density(tau_of(hi)) >= target, or hi == steps; density(tau_of(lo)) < target
    d_hi = _mean_density(stacked, tau_of(hi), sim)
    if d_hi <= target:
        return 1.0, d_hi
    d_lo = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        d = _mean_density(stacked, tau_of(mid), sim)
        if d >= target:
            hi, d_hi = mid, d
        else:
            lo, d_lo = mid, d
    if d_lo is not None and target - d_lo <= d_hi - target:
        return tau_of(lo), d_lo
    return tau_of(hi), d_hi


def pmin_for_density(estimates: Sequence[TopPEstimate], density: float, *, sim: float = DEFAULT_SIM,
                     steps_per_decade: int = 200, lowest: float = 1e-6) -> tuple[float, float]:
    """``(pmin, mean density)``: the threshold of the ``pmin`` kind, on a geometric grid from ``lowest`` to 1 with
    ``steps_per_decade`` steps per factor 10 (each rounded to 4 significant digits), whose maps give the calls of
    ``estimates`` (:func:`~rotvid.kernels.sparsity.topp.topp_estimate`'s: the same estimate) the mean density closest
    to ``density``; bisected, as :func:`topp_tau_for_density` (the density falls as the threshold grows). A target
    above the density at ``lowest`` gets ``lowest``; one below what is always kept gets 1."""
    target = _check_density(density)
    if not estimates:
        raise ValueError("estimates: expected the estimates of at least one call, got none")
    if not 0 < lowest < 1 or steps_per_decade < 1:
        raise ValueError(f"lowest, steps_per_decade: expected 0 < lowest < 1 and >= 1 step, got {lowest!r}, "
                         f"{steps_per_decade!r}")
    stacked = _stacked(estimates)
    n = math.ceil(-math.log10(lowest) * steps_per_decade)

    def pmin_of(i: int) -> float:  # i = 0: lowest ... n: 1
        return 1.0 if i >= n else float(f"{lowest * 10 ** (i / steps_per_decade):.4g}")

    lo, hi = 0, n  # invariant: density(pmin_of(lo)) >= target (or lo == 0), density(pmin_of(hi)) < target
    d_lo = _mean_density(stacked, pmin_of(lo), sim, kind="pmin")
    if d_lo <= target:
        return pmin_of(lo), d_lo
    d_hi = _mean_density(stacked, pmin_of(hi), sim, kind="pmin")
    if d_hi >= target:
        return pmin_of(hi), d_hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        d = _mean_density(stacked, pmin_of(mid), sim, kind="pmin")
        if d >= target:
            lo, d_lo = mid, d
        else:
            hi, d_hi = mid, d
    if d_lo - target <= target - d_hi:
        return pmin_of(lo), d_lo
    return pmin_of(hi), d_hi
