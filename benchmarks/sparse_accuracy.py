"""Block-sparse attention accuracy: error vs density for each map kind, beside dense int8-fp8 (and SageAttention2-8b).

SYNTHETIC inputs with spatio-temporal locality (made up, not captured from a model). Per head, on a (frames,
height, width) token grid after patchifying, tokens frame-major:

    q₀ = a·μ + b·c(f, y, x) + e·ε_q,    k₀ = a·μ + b·c(f, y, x) + e·ε_k,    Q = RoPE(q₀), K = RoPE(k₀)

with μ one random direction per head shared by every token (``--shared`` a), c a smooth random field over the grid
(random Fourier features of (f, y, x) with wave numbers ~ N(0, 1 / ``--field-scale``²) per axis, projected to the
head dim; ``--content`` b) and ε i.i.d. noise (``--noise`` e); RoPE is Wan's real 3D RoPE
(:func:`rotvid.rope.tables.rope_table_3d`, interleaved pairs). After RoPE the shared part scores
``Σ_pairs |μ_pair|² cos(ω_pair Δ)`` between tokens Δ apart along each axis: largest at Δ = 0 and falling with frame
distance and with spatial distance over Wan's RoPE frequencies; the shared field adds similarity between nearby
tokens. Q and K are scaled together so the scores ``q·k / √D`` have standard deviation ``--score-std`` (measured on
sampled pairs). V = a smooth field + noise + a channel bias. The run prints where the exact attention mass falls by
temporal distance, so the locality of each run is stated beside its numbers.

Measured against exact float64 attention on the same (bf16-rounded) inputs, for each map (its density over the
map's blocks; the exact mass the kept blocks hold, mean and worst query row): float64 attention with the map (the
sparsity error alone), the int8-fp8 reference with the map (what a sparse int8-fp8 kernel computes: sparsity and
quantization), and that against float64 attention *with the same map* (the quantization error over the kept
keys). Maps: ``radial`` specs (static, from the grid), ``topp`` specs (dynamic; with their estimated dropped mass)
and random maps with the diagonal kept (no structure, for comparison) at densities 0.2 / 0.35 / 0.5 / 0.75.
Dense rows: int8-fp8 (the CUDA kernel on a GPU that runs it, else the reference) and SageAttention2-8b
(``sageattn_qk_int8_pv_fp8_cuda_sm90``, when it imports on a GPU; skipped with a note otherwise).

    python -m benchmarks.sparse_accuracy                       # CPU, a small grid (12x16x24, 4608 tokens)
    python -m benchmarks.sparse_accuracy --device cuda          # GPU, Wan2.1 480p (21x30x52, 32760 tokens)

Writes ``results/sparse_accuracy_<date>_<commit>.md`` and ``.json`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

import rotvid.pipelines.families  # noqa: F401 -- the built-in families register their RoPE facts (rope_table_3d)
from rotvid.kernels import attention, metrics
from rotvid.kernels.sparsity import BlockMap, TokenGrid, build_block_map, parse_sparsity
from rotvid.kernels.sparsity.block_map import blocks_for
from rotvid.rope.tables import apply_rope_interleaved, rope_table_3d

from benchmarks.provenance import git_commit
from benchmarks.study_io import RESULTS_DIR, command_line, local_stamp, parse_grid, write_results

CPU_GRID = (12, 16, 24)
GPU_GRID = (21, 30, 52)  # Wan2.1 480p after patchifying
RADIAL = ("radial", "radial:window=8", "radial:window=4", "radial:window=2", "radial:window=0",
          "radial:band=0,window=4", "radial:band=0,window=2", "radial:band=0,window=0")
TOPP = ("topp:0.5", "topp:0.7", "topp:0.8", "topp:0.9", "topp:0.95", "topp:0.99", "topp:0.9,sim=-1")
RANDOM_DENSITIES = (0.2, 0.35, 0.5, 0.75)
QUERY_CHUNK = 512  # query rows per float64 pass


# ---- the generator ------------------------------------------------------------------------------------------


def _field(grid, rank, head_dim, scale, gen, dtype=torch.float64) -> torch.Tensor:
    """A smooth random field over the grid, [N, head_dim]: random Fourier features of (f, y, x) in token units."""
    f, h, w = grid
    coords = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"), -1)
    coords = coords.reshape(-1, 3).to(dtype)
    omega = torch.randn(3, rank, generator=gen, dtype=dtype) / scale
    phase = torch.rand(rank, generator=gen, dtype=dtype) * 2 * math.pi
    feats = math.sqrt(2.0) * torch.cos(coords @ omega + phase)
    return feats @ (torch.randn(rank, head_dim, generator=gen, dtype=dtype) / math.sqrt(rank))


def local_rope_qkv(grid, *, heads, head_dim, seed, shared, content, noise, field_scale, score_std):
    """Q, K, V float64 [1, heads, N, head_dim] (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1] * grid[2]
    cos, sin = rope_table_3d("wan", grid, head_dim)
    qs, ks, vs = [], [], []
    for _ in range(heads):
        mu = torch.randn(1, head_dim, generator=gen, dtype=torch.float64)
        c = _field(grid, 32, head_dim, field_scale, gen)
        q0 = shared * mu + content * c + noise * torch.randn(n, head_dim, generator=gen, dtype=torch.float64)
        k0 = shared * mu + content * c + noise * torch.randn(n, head_dim, generator=gen, dtype=torch.float64)
        qs.append(apply_rope_interleaved(q0, cos, sin))
        ks.append(apply_rope_interleaved(k0, cos, sin))
        vs.append(_field(grid, 32, head_dim, field_scale, gen) + 0.5 * torch.randn(n, head_dim, generator=gen,
                  dtype=torch.float64) + torch.randn(1, head_dim, generator=gen, dtype=torch.float64))
    q, k, v = (torch.stack(t)[None] for t in (qs, ks, vs))
    rows = torch.randint(0, n, (2048,), generator=gen)
    cols = torch.randint(0, n, (2048,), generator=gen)
    sample = (q[..., rows, :] * k[..., cols, :]).sum(-1) / math.sqrt(head_dim)
    factor = math.sqrt(score_std / float(sample.std()))
    return q * factor, k * factor, v


# ---- exact attention ------------------------------------------------------------------------------------------


def exact_attention(q, k, v, block_map: BlockMap | None = None):
    """float64 softmax(q kᵀ / √D) v over [1, H, N, D] tensors, keys outside ``block_map`` masked (a row with no key:
    0), in query chunks; also the exact dense mass of the kept keys per row [H, N] (1 without a map)."""
    d = q.shape[-1]
    n = q.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    kept = torch.ones(q.shape[1], n, dtype=torch.float64, device=q.device)
    kd, vd = k[0].double(), v[0].double()
    dense_map = block_map.to_dense_mask()[0] if block_map is not None else None  # [H', Tq, Tk]
    for lo in range(0, n, QUERY_CHUNK):
        hi = min(lo + QUERY_CHUNK, n)
        s = q[0, :, lo:hi].double() @ kd.transpose(-1, -2) / math.sqrt(d)
        if dense_map is None:
            out[0, :, lo:hi] = torch.softmax(s, -1) @ vd
            continue
        rows = torch.arange(lo, hi, device=q.device) // 128
        cols = torch.arange(n, device=q.device) // 128
        mask = dense_map[:, rows][:, :, cols]  # [H', rows, N]
        kept[:, lo:hi] = (torch.softmax(s, -1) * mask).sum(-1)
        s = s.masked_fill(~mask, -math.inf)
        empty = torch.isneginf(s).all(-1, keepdim=True)
        out[0, :, lo:hi] = torch.softmax(s.masked_fill(empty, 0), -1).masked_fill(empty, 0) @ vd
    return out, kept


def mass_by_frame_distance(q, k, grid, rows=256):
    """Mean exact attention mass at temporal distance 0, 1, 2-3, 4-7, 8+ (sampled query rows)."""
    n, ft = q.shape[2], grid[1] * grid[2]
    idx = torch.linspace(0, n - 1, rows, device=q.device).long()
    s = q[0, :, idx].double() @ k[0].double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    p = torch.softmax(s, -1)
    dt = (idx[:, None] // ft - torch.arange(n, device=q.device)[None] // ft).abs()
    bands = {"0": (0, 0), "1": (1, 1), "2-3": (2, 3), "4-7": (4, 7), "8+": (8, 10**9)}
    return {name: float((p * ((dt >= lo) & (dt <= hi))).sum(-1).mean()) for name, (lo, hi) in bands.items()}


# ---- the study ------------------------------------------------------------------------------------------------


def random_map(heads, n, density, seed, device) -> BlockMap:
    t = blocks_for(n)
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(1, heads, t, t, generator=gen) < density) | torch.eye(t, dtype=torch.bool)
    return BlockMap.from_mask(mask.to(device), n_q=n, n_kv=n)


def row(kind, spec, bm, q, k, v, ref, *, kv_t, build_ms=None, dropped=None, sync):
    masked, kept = exact_attention(q, k, v, bm)
    start = time.perf_counter()
    quant = attention(*kv_t, recipe="int8-fp8", backend="reference", block_map=bm)
    sync()
    return {
        "kind": kind, "spec": spec, "density": float(bm.density()),
        "kept_mass_mean": float(kept.mean()), "kept_mass_min": float(kept.min()),
        "est_dropped_mass": None if dropped is None else float(dropped.mean()),
        "map_only": metrics.summarize(ref, masked),
        "int8fp8_map": metrics.summarize(ref, quant),
        "int8fp8_vs_masked_fp64": metrics.summarize(masked, quant),
        "build_ms": build_ms, "run_s": time.perf_counter() - start,
    }


def dense_rows(qb, kb, vb, ref, device) -> tuple[list[dict], str]:
    rows, notes = [], []
    backend = "auto" if device.type == "cuda" else "reference"
    out = attention(qb, kb, vb, recipe="int8-fp8", backend=backend)
    rows.append({"kind": "dense", "spec": f"int8-fp8 ({'CUDA kernel' if device.type == 'cuda' else 'reference'})",
                 "density": 1.0, "int8fp8_map": metrics.summarize(ref, out)})
    if device.type != "cuda":
        notes.append("SageAttention2-8b: skipped (no CUDA GPU)")
        return rows, "; ".join(notes)
    try:
        from sageattention import sageattn_qk_int8_pv_fp8_cuda_sm90
    except ImportError as err:
        notes.append(f"SageAttention2-8b: skipped (not importable: {err})")
    else:
        sage = sageattn_qk_int8_pv_fp8_cuda_sm90(qb, kb, vb, tensor_layout="HND", qk_quant_gran="per_thread",
                                                 pv_accum_dtype="fp32+fp32")
        rows.append({"kind": "dense", "spec": "SageAttention2-8b", "density": 1.0,
                     "int8fp8_map": metrics.summarize(ref, sage)})
    return rows, "; ".join(notes)


def _fmt(x, digits=4):
    return "–" if x is None else f"{x:.{digits}f}"


def format_table(rows) -> str:
    lines = [
        "| kind | spec | density | kept mass mean / worst row | est. dropped | map only: cos / SQNR dB | "
        "int8-fp8 + map: cos / SQNR dB | int8-fp8 + map vs fp64 + map: SQNR dB | build ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        q = r["int8fp8_map"]
        if r["kind"] == "dense":
            lines.append(f"| dense | {r['spec']} | 1.000 | 1 | – | – | {q['cosine']:.5f} / {q['sqnr_db']:.1f} | – | – |")
            continue
        m = r["map_only"]
        lines.append(
            f"| {r['kind']} | `{r['spec']}` | {r['density']:.3f} | {r['kept_mass_mean']:.4f} / {r['kept_mass_min']:.4f} "
            f"| {_fmt(r['est_dropped_mass'])} | {m['cosine']:.5f} / {m['sqnr_db']:.1f} "
            f"| {q['cosine']:.5f} / {q['sqnr_db']:.1f} | {r['int8fp8_vs_masked_fp64']['sqnr_db']:.1f} "
            f"| {_fmt(r['build_ms'], 2)} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--grid", type=parse_grid, default=None, help=f"FxHxW tokens (default {CPU_GRID} on CPU, {GPU_GRID} on GPU)")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shared", type=float, default=1.0, help="a: weight of the shared direction (RoPE locality)")
    p.add_argument("--content", type=float, default=1.0, help="b: weight of the smooth content field")
    p.add_argument("--noise", type=float, default=0.5, help="e: i.i.d. noise")
    p.add_argument("--field-scale", type=float, default=4.0, help="correlation length of the content field, tokens")
    p.add_argument("--score-std", type=float, default=3.0, help="standard deviation of q·k/√D")
    p.add_argument("--radial", default=",".join(RADIAL), help="radial specs, comma list (a spec's own NAME=VALUE parameters follow it)")
    p.add_argument("--topp", default=",".join(TOPP), help="top-p specs")
    p.add_argument("--random", default=",".join(map(str, RANDOM_DENSITIES)), help="random-map densities ('' for none)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--no-write", action="store_true")
    return p


def _specs(text: str) -> list[str]:
    """Specs from a comma list where a spec's own parameters also use commas: a new spec starts at a kind name."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if out and "=" in part and ":" not in part:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    grid = args.grid or (GPU_GRID if device.type == "cuda" else CPU_GRID)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.time()
    q, k, v = local_rope_qkv(grid, heads=args.heads, head_dim=args.head_dim, seed=args.seed, shared=args.shared,
                             content=args.content, noise=args.noise, field_scale=args.field_scale,
                             score_std=args.score_std)
    qb, kb, vb = (t.to(device=device, dtype=torch.bfloat16) for t in (q, k, v))
    q, k, v = (t.double() for t in (qb, kb, vb))  # the reference sees the bf16 inputs the kernels see
    ref, _ = exact_attention(q, k, v)
    locality = mass_by_frame_distance(q, k, grid)
    token_grid = TokenGrid(*grid)
    n = token_grid.num_tokens
    t_blocks = blocks_for(n)
    rows, note = dense_rows(qb, kb, vb, ref, device)
    for spec in _specs(args.radial) + _specs(args.topp):
        spec = parse_sparsity(spec)
        sync()
        start = time.perf_counter()
        built = build_block_map(spec, qb, kb, grid=token_grid)
        sync()
        build_ms = (time.perf_counter() - start) * 1e3 if device.type == "cuda" else None  # (no CPU speed figures)
        rows.append(row(spec.kind, str(spec), built.block_map, q, k, v, ref, kv_t=(qb, kb, vb), build_ms=build_ms,
                        dropped=built.dropped_mass, sync=sync))
        print(f"{spec}: density {rows[-1]['density']:.3f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    for i, density in enumerate(float(x) for x in args.random.split(",") if x.strip()):
        bm = random_map(args.heads, n, density, args.seed + i, device)
        rows.append(row("random", f"random d≈{density} (diagonal kept)", bm, q, k, v, ref, kv_t=(qb, kb, vb),
                        sync=sync))
    order = {"dense": 0, "radial": 1, "topp": 2, "random": 3}
    rows.sort(key=lambda r: (order[r["kind"]], -r["density"]))
    commit = git_commit()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    where = ", ".join(f"Δf {b}: {m:.3f}" for b, m in locality.items())
    text = "\n".join([
        f"# Sparse attention accuracy ({local_stamp()}, commit {commit}, {name})\n",
        f"command: `{command_line('sparse_accuracy', argv)}`  ",
        f"SYNTHETIC RoPE-structured inputs with spatio-temporal locality (generator in the script's docstring): grid "
        f"{'x'.join(map(str, grid))} = {n} tokens ({t_blocks} blocks of 128), {args.heads} heads, head_dim "
        f"{args.head_dim}, bf16 inputs; shared {args.shared}, content {args.content}, noise {args.noise}, field "
        f"scale {args.field_scale} tokens, score std {args.score_std}, seed {args.seed}; {time.time() - t0:.0f} s.  ",
        f"Exact attention mass by temporal distance (mean over sampled query rows): {where}.  ",
        "Errors against exact float64 dense attention (cos = cosine similarity, SQNR in dB); the last error column is "
        "the int8-fp8 reference with the map against float64 attention with the same map (quantization error over "
        "the kept keys). Density: kept blocks / all blocks. Kept mass: exact dense softmax mass of the kept keys per "
        "query row. Build ms: the map's first build on this GPU (radial maps are then cached; none on the CPU). "
        f"{note + '.' if note else ''}\n",
        format_table(rows),
    ])  # fmt: skip
    print(text)
    result = {"rows": rows, "grid": grid, "device": name, "commit": commit, "locality": locality,
              "args": {k_: v_ for k_, v_ in vars(args).items() if k_ != "out_dir"}, "note": note}
    if not args.no_write:
        stem = write_results(args.out_dir, "sparse_accuracy", commit, text, result)
        print(f"\nwrote {stem.name}.md and .json in --out-dir", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
