"""How close top-p's block estimate ranks to the oracle: kept attention mass at a fixed per-row block count, on the
bundled proxy's real attention at a size where blocks matter.

    python -m benchmarks.topp_estimate_study [--size 512x512x65] [--step 3 [9 ...]] [--densities 0.2 0.3 0.5]

The untouched proxy pipeline (float32, CPU or GPU) runs up to the last denoising step of ``--step`` and its
self-attention queries and keys of those steps are captured (every block, both CFG branches: SDPA's inputs, after RoPE; rotvid's
rotations are orthogonal and change no score). For every call and head, the exact block masses
(:func:`rotvid.kernels.sparsity.oracle.block_attention_mass`: per query tile of 128 rows, the mean softmax mass of
each key block of 128 keys), then per density ``d`` each row keeps its ``ceil(d · Tk)`` blocks ranked by

* ``oracle``: the exact masses (the most any map with those counts keeps);
* ``means``: ``sm_scale · q̄_i·k̄_j`` -- the score of the block means, what ``topp`` ranks by
  (:mod:`rotvid.kernels.sparsity.topp`; its ``log n_j`` is the same for every full block);
* ``means+key-var``: plus ``½ sm_scale² q̄_iᵀ Σ_j q̄_i``, Σ_j the covariance of block j's keys -- the log-normal
  correction of ``E_k exp(sm_scale · q̄·k)`` for keys that spread along the query mean (a second-moment estimate);
* ``means+both-var``: plus the same term of the query tile's spread along the key mean.

It prints, per ranking and density, the mean kept mass and its ratio to the oracle's: with the per-row counts the
same for all, that is the ranking alone. A second table asks how the budget is spread over rows, at the same mean
density over all the calls: ``even`` (every row ``ceil(d · Tk)`` blocks, by the block means), ``topp`` (``topp``'s
own per-row ``tau`` and ``sim``, :func:`rotvid.kernels.sparsity.topp.topp_estimate`, ``tau`` matched to the density
by :func:`rotvid.kernels.sparsity.density.topp_tau_for_density`), ``pmin`` (the ``pmin`` kind's own selection, its
threshold matched by :func:`~rotvid.kernels.sparsity.density.pmin_for_density`), ``topp-sim-off`` and
``pmin-sim-off`` (the same with the ``sim`` rule off: no row or column kept whole for its low self-similarity),
``threshold`` (the blocks whose estimated share ``P̂``
of their row's mass is above one threshold over every call and head, chosen to keep ``d`` of all blocks, the diagonals
first), and ``oracle-threshold`` (the same by the exact masses: the most mass any maps of that total size keep, up to
the diagonals they must hold). Budgets move between rows, heads and calls in all but ``even``; ``threshold-per-call``
and ``oracle-threshold-per-call`` are the two thresholds chosen in each call on its own (every call keeps ``d`` of its
blocks, as the ``oracle`` kind's maps do, the rows and heads of a call sharing the budget). With several steps, a
third table gives each allocation's kept mass and density per step at each density: one threshold over every call
spends blocks where the estimate is peaked and starves the calls where it is flat. Writes ``benchmarks/results/topp_estimate_<date>_<commit>.md/.json`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from benchmarks.provenance import git_commit
from benchmarks.sparse_oracle import parse_size as sparse_oracle_size
from benchmarks.study_io import RESULTS_DIR, command_line, local_stamp, write_results
from rotvid.kernels.sparsity.block_map import MAP_BLOCK
from rotvid.kernels.sparsity.oracle import block_attention_mass

RANKINGS = ("oracle", "means", "means+key-var", "means+both-var")


def parse_size(text: str) -> tuple[int, int, int]:
    """``HxWxF`` -> (height, width, frames) (:func:`benchmarks.sparse_oracle.parse_size`), sizes the proxy takes."""
    h, w, f = sparse_oracle_size(text)
    if h % 16 or w % 16 or (f - 1) % 4:
        raise argparse.ArgumentTypeError(f"size: height and width multiples of 16, frames 4k + 1, got {text!r}")
    return h, w, f


class _Stop(Exception):
    pass


def capture(size: tuple[int, int, int], steps: list[int], prompt: str,
            device: str) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """The self-attention (q, k, step) triples, q and k [1, H, N, D], of the denoising steps ``steps`` of the proxy
    at ``size``."""
    from rotvid.pipelines.loading import load_pipeline

    h, w, f = size
    n = ((f - 1) // 4 + 1) * (h // 16) * (w // 16)  # the proxy's VAE (4, 8) and patch (1, 2, 2)
    pipe = load_pipeline("proxy", dtype=torch.float32, device=device)
    calls, at = [], {"step": 0}
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        q = args[0] if args else kwargs["query"]
        k = args[1] if len(args) > 1 else kwargs["key"]
        if at["step"] in steps and q.shape[-2] == n and k.shape[-2] == n:
            calls.append((q.detach().clone(), k.detach().clone(), at["step"]))
        return sdpa(*args, **kwargs)

    def step_end(_pipe, i, _t, kwargs):
        at["step"] = i + 1
        if i + 1 > max(steps):
            raise _Stop
        return kwargs

    F.scaled_dot_product_attention = recording
    try:
        with torch.inference_mode():
            pipe(prompt=prompt, height=h, width=w, num_frames=f, generator=torch.Generator().manual_seed(0),
                 callback_on_step_end=step_end, output_type="latent")
    except _Stop:
        pass
    finally:
        F.scaled_dot_product_attention = sdpa
    return calls


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """[H, N, D] -> [H, T, 128, D] (N a multiple of 128 here: the proxy's token counts at the study's sizes)."""
    h, n, d = x.shape
    return x.view(h, n // MAP_BLOCK, MAP_BLOCK, d)


def rankings(q: torch.Tensor, k: torch.Tensor, sm_scale: float) -> dict[str, torch.Tensor]:
    """The block scores each ranking orders a row by, [H, Tq, Tk] (q, k: [H, N, D] float64)."""
    qb, kb = _blocks(q), _blocks(k)
    qm, km = qb.mean(dim=2), kb.mean(dim=2)
    means = torch.einsum("hid,hjd->hij", qm, km) * sm_scale
    kc, qc = kb - km.unsqueeze(2), qb - qm.unsqueeze(2)
    key_cov = torch.einsum("hjnd,hjne->hjde", kc, kc) / MAP_BLOCK
    query_cov = torch.einsum("hind,hine->hide", qc, qc) / MAP_BLOCK
    key_var = torch.einsum("hid,hjde,hie->hij", qm, key_cov, qm) * sm_scale**2
    query_var = torch.einsum("hjd,hide,hje->hij", km, query_cov, km) * sm_scale**2
    return {"means": means, "means+key-var": means + 0.5 * key_var,
            "means+both-var": means + 0.5 * (key_var + query_var)}


def kept(calls, densities) -> dict[str, dict[float, float]]:
    """Mean kept mass per ranking and density over every call and head."""
    sums = {r: {d: 0.0 for d in densities} for r in RANKINGS}
    heads = 0
    for q, k, _ in calls:
        q, k = q[0].double(), k[0].double()
        if q.shape[1] % MAP_BLOCK:
            raise SystemExit(f"topp_estimate_study: {q.shape[1]} tokens is not a multiple of {MAP_BLOCK}")
        sm_scale = q.shape[-1] ** -0.5
        mass = block_attention_mass(q[None], k[None], sm_scale=sm_scale)[0]  # [H, Tq, Tk]
        scores = {"oracle": mass, **rankings(q, k, sm_scale)}
        for d in densities:
            count = max(1, math.ceil(d * mass.shape[-1]))
            for name, s in scores.items():
                top = s.topk(count, dim=-1).indices
                sums[name][d] += torch.gather(mass, -1, top).sum(dim=-1).mean(dim=-1).sum().item()
        heads += mass.shape[0]
    return {r: {d: v / heads for d, v in per.items()} for r, per in sums.items()}


ALLOCATIONS = ("even", "topp", "topp-sim-off", "pmin", "pmin-sim-off", "threshold", "oracle-threshold",
               "threshold-per-call", "oracle-threshold-per-call")


def _threshold_keeps(scores: list[torch.Tensor], density: float) -> list[torch.Tensor]:
    """bool [H, Tq, Tk] per call: one threshold over every call and head (as ``topp``'s one ``tau`` is), keeping
    ``round(density · all blocks)`` blocks -- the diagonals first, then the highest-scoring others."""
    diag = [torch.eye(sc.shape[1], sc.shape[2], dtype=torch.bool).expand_as(sc) for sc in scores]
    flat = torch.cat([sc.masked_fill(dg, math.inf).flatten() for sc, dg in zip(scores, diag)])
    n = max(sum(int(dg.sum()) for dg in diag), round(density * flat.numel()))
    keep = torch.zeros_like(flat, dtype=torch.bool).scatter(0, flat.topk(n).indices, True)
    return [part.view(sc.shape) for part, sc in zip(keep.split([sc.numel() for sc in scores]), scores)]


def allocations(calls, densities) -> tuple[dict, dict]:
    """Per allocation and density: (mean kept mass, mean density) over every call and head; and the same per step
    (``{allocation: {density: {step: (mass, density)}}}``)."""
    from rotvid.kernels.sparsity.density import pmin_for_density, topp_tau_for_density
    from rotvid.kernels.sparsity.topp import DEFAULT_SIM, pmin_keep, topp_estimate, topp_keep

    prepared = []
    for q, k, _ in calls:
        mass = block_attention_mass(q.double(), k.double())[0]
        est = topp_estimate(q.double(), k.double(), tau=1.0)
        prepared.append((mass, est))
    steps = [step for _, _, step in calls]
    out = {a: {} for a in ALLOCATIONS}
    by_step = {a: {} for a in ALLOCATIONS}
    for d in densities:
        estimates = [est for _, est in prepared]
        tau, _ = topp_tau_for_density(estimates, d)
        tau_off, _ = topp_tau_for_density(estimates, d, sim=-1.0)
        pmin, _ = pmin_for_density(estimates, d)
        pmin_off, _ = pmin_for_density(estimates, d, sim=-1.0)
        sums = {a: [0.0, 0.0] for a in ALLOCATIONS}
        step_sums = {a: {st: [0.0, 0.0, 0] for st in steps} for a in ALLOCATIONS}
        heads = 0
        threshold = _threshold_keeps([est.mass[0] for _, est in prepared], d)
        oracle_threshold = _threshold_keeps([mass for mass, _ in prepared], d)
        for ci, (mass, est) in enumerate(prepared):
            tk = mass.shape[-1]
            count = max(1, math.ceil(d * tk))
            even = torch.zeros_like(mass, dtype=torch.bool).scatter(-1, est.mass[0].topk(count, dim=-1).indices, True)
            keeps = {
                "even": even,
                "topp": topp_keep(est.mass, est.q_sim, est.k_sim, est.k_live, tau=tau, sim=DEFAULT_SIM)[0],
                "topp-sim-off": topp_keep(est.mass, est.q_sim, est.k_sim, est.k_live, tau=tau_off, sim=-1.0)[0],
                "pmin": pmin_keep(est.mass, est.q_sim, est.k_sim, est.k_live, pmin=pmin, sim=DEFAULT_SIM)[0],
                "pmin-sim-off": pmin_keep(est.mass, est.q_sim, est.k_sim, est.k_live, pmin=pmin_off, sim=-1.0)[0],
                "threshold": threshold[ci],
                "oracle-threshold": oracle_threshold[ci],
                "threshold-per-call": _threshold_keeps([est.mass[0]], d)[0],
                "oracle-threshold-per-call": _threshold_keeps([mass], d)[0],
            }
            for a, keep in keeps.items():
                got = (mass * keep).sum(dim=-1).mean(dim=-1).sum().item()
                size = keep.float().mean(dim=(-1, -2)).sum().item()
                sums[a][0] += got
                sums[a][1] += size
                acc = step_sums[a][steps[ci]]
                acc[0], acc[1], acc[2] = acc[0] + got, acc[1] + size, acc[2] + mass.shape[0]
            heads += mass.shape[0]
        for a in ALLOCATIONS:
            out[a][d] = (sums[a][0] / heads, sums[a][1] / heads)
            by_step[a][d] = {st: (v[0] / v[2], v[1] / v[2]) for st, v in step_sums[a].items()}
    return out, by_step


def markdown(result: dict) -> str:
    lines = [f"### topp_estimate_study: {result['date']}, commit {result['commit']}", "",
             f"`{result['command']}`; the proxy at {result['size']}, step(s) {result['step']}, {result['calls']} "
             f"self-attention calls, {result['blocks_per_row']} key blocks per row; kept mass at a fixed per-row count "
             "(ratio to the oracle's):", "",
             "| ranking | " + " | ".join(f"density {d}" for d in result["densities"]) + " |",
             "| --- |" + " --- |" * len(result["densities"])]
    for name in RANKINGS:
        cells = []
        for d in result["densities"]:
            got, best = result["kept"][name][str(d)], result["kept"]["oracle"][str(d)]
            cells.append(f"{got:.4f} ({got / best:.4f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "The budget over rows, at the same mean density (kept mass, the density reached in brackets):", "",
              "| allocation | " + " | ".join(f"density {d}" for d in result["densities"]) + " |",
              "| --- |" + " --- |" * len(result["densities"])]
    for name in ALLOCATIONS:
        cells = [f"{result['allocations'][name][str(d)][0]:.4f} ({result['allocations'][name][str(d)][1]:.3f})"
                 for d in result["densities"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    steps = sorted({int(st) for per in result["by_step"]["even"].values() for st in per})
    if len(steps) > 1:
        lines += ["", "Per step (kept mass, the step's density in brackets):", "",
                  "| allocation | density | " + " | ".join(f"step {st}" for st in steps) + " |",
                  "| --- | --- |" + " --- |" * len(steps)]
        for name in ALLOCATIONS:
            for d in result["densities"]:
                per = result["by_step"][name][str(d)]
                cells = [f"{per[str(st)][0]:.4f} ({per[str(st)][1]:.3f})" for st in steps]
                lines.append(f"| {name} | {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.topp_estimate_study",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=(512, 512, 65), help="HxWxF (default 512x512x65)")
    ap.add_argument("--step", type=int, nargs="+", default=[3],
                    help="the denoising step(s) captured (default 3 of the proxy's 12)")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    ap.add_argument("--prompt", default="a red fox running through fresh snow in a pine forest")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if min(args.step) < 0:
        ap.error(f"--step: expected step indices >= 0, got {args.step}")
    steps = sorted(set(args.step))
    if not all(0 < d <= 1 for d in args.densities):
        ap.error(f"--densities: expected values in (0, 1], got {args.densities}")
    t0 = time.perf_counter()
    calls = capture(args.size, steps, args.prompt, args.device)
    missing = sorted(set(steps) - {step for _, _, step in calls})
    if missing:
        raise SystemExit(f"topp_estimate_study: no self-attention call at step(s) {missing} (the proxy runs 12)")
    print(f"captured {len(calls)} calls at step(s) {steps} in {time.perf_counter() - t0:.0f} s", flush=True)
    alloc, by_step = allocations(calls, args.densities)
    result = dict(date=local_stamp(), commit=git_commit(), command=command_line("topp_estimate_study", argv),
                  size="x".join(map(str, args.size)), step=steps if len(steps) > 1 else steps[0], calls=len(calls),
                  blocks_per_row=calls[0][1].shape[-2] // MAP_BLOCK, densities=args.densities,
                  kept={r: {str(d): v for d, v in per.items()} for r, per in kept(calls, args.densities).items()},
                  allocations={a: {str(d): v for d, v in per.items()} for a, per in alloc.items()},
                  by_step={a: {str(d): {str(st): v for st, v in per_st.items()} for d, per_st in per.items()}
                           for a, per in by_step.items()})
    text = markdown(result)
    print(text)
    if not args.no_write:
        print(f"wrote {write_results(RESULTS_DIR, 'topp_estimate', result['commit'], text, result)}.md/.json")
    return result


if __name__ == "__main__":
    main()
