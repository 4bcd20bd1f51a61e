"""Kernel-level accuracy study: the paper's Table 1 on Q/K/V tensors, with the reference recipes.

For every tensor set (SYNTHETIC RoPE-structured Q/K/V from :mod:`rotvid.rope.synthetic` over
several families, grids and seeds, plus any real dumps given with ``--dump``) and every setting

    Q/K rotation ∈ {none, interleaved, half, full (or learned:<file>)}
  × recipe ∈ {int4 (range-optimized P), int4-sym-p (symmetric P), int4-fp8, int8-fp8, nvfp4}

it runs :func:`rotvid.kernels.reference.attention_reference` on the rotated tensors and compares
the output with exact float64 attention on the *unrotated* tensors (rotations are exact in full
precision, so any difference is quantization error). V gets the per-head Hadamard (as deployed:
fused offline into W_v / W_o) and the output is rotated back, unless ``--v-hadamard off``.
A second table compares V Hadamard off/on with no Q/K rotation.

Prints one table (cosine, relative L2, SQNR in dB: mean and worst over the tensor sets of each
source) and writes it, with the raw per-case numbers, to ``benchmarks/results/``.

    python -m benchmarks.accuracy_study                       # default synthetic study
    python -m benchmarks.accuracy_study --dump a.safetensors  # plus real captured tensors
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import torch

import rotvid.pipelines.families  # noqa: F401 -- the built-in families register their RoPE facts (synthetic, dumps)
from rotvid.kernels import metrics
from rotvid.kernels.recipes import attention_reference
from rotvid.kernels.reference import DEFAULT_BLOCK_N
from rotvid.rope.dumps import load_qkv_dump
from rotvid.rope.hadamard import hadamard_matrix
from rotvid.rope.incoherence import incoherence, incoherence_summary
from rotvid.rope.model_facts import get_rope_facts
from rotvid.rope.rotations import PairRotation, Rotation, make_rotation
from rotvid.rope.synthetic import synthetic_rope_qkv

from benchmarks.provenance import git_commit
from benchmarks.study_io import RESULTS_DIR, command_line, local_stamp, parse_grid, write_results

HEAD_DIMS = {"wan": 128, "hunyuan_video": 128, "cogvideox": 64}
DEFAULT_FAMILIES = ("wan", "hunyuan_video", "cogvideox")
DEFAULT_GRIDS = ((4, 8, 12), (5, 12, 16), (8, 15, 20))
DEFAULT_ROTATIONS = ("none", "interleaved", "half", "full")
DEFAULT_RECIPES = ("int4", "int4-sym-p", "int4-fp8", "int8-fp8", "nvfp4")
P_MODE = {"int4": "range", "int4-sym-p": "sym", "int4-fp8": "fp8", "int8-fp8": "fp8", "nvfp4": "fp4", "fp16": "-"}


@dataclass
class StudyCase:
    """One tensor set: q, k, v float32 [B, H, N, D] (BHND), q/k post-RoPE and un-rotated."""

    source: str
    label: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    segments: tuple[int, ...]
    head_dim: int
    block: int | None = None
    kv_len: int | None = None


def quantizer_study_setup(description: str, argv=None) -> tuple[list[StudyCase], list[str]]:
    """The command line of the quantizer studies (int4_*_groups_study.py): ``--rotations``, ``--seeds``, ``--heads``
    over the default synthetic families and grids; returns their cases and rotations (2 CPU threads)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rotations", default="none,half")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--heads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    return synthetic_cases(DEFAULT_FAMILIES, DEFAULT_GRIDS, args.seeds, args.heads), args.rotations.split(",")


def synthetic_cases(families, grids, seeds, heads) -> list[StudyCase]:
    cases = []
    for family in families:
        for grid in grids:
            for seed in range(seeds):
                s = synthetic_rope_qkv(family, grid, heads=heads, head_dim=HEAD_DIMS[family], seed=seed)
                cases.append(
                    StudyCase(
                        source=f"synthetic:{family}",
                        label=f"grid={'x'.join(map(str, grid))} seed={seed}",
                        q=s.q, k=s.k, v=s.v, segments=s.segments, head_dim=s.head_dim,
                    )  # fmt: skip
                )
    return cases


def dump_cases(paths, max_query_tokens: int, max_heads: int) -> list[StudyCase]:
    cases = []
    for path in paths:
        d = load_qkv_dump(path)
        q, k, v = (t.float() for t in d.bhnd())
        q, k, v = q[:, :max_heads], k[:, :max_heads], v[:, :max_heads]
        if q.shape[2] > max_query_tokens:  # rows of attention are independent: subsample queries
            idx = torch.linspace(0, q.shape[2] - 1, max_query_tokens).round().long()
            q = q[:, :, idx]
        head_dim = q.shape[-1]
        cases.append(
            StudyCase(
                source=f"dump:{Path(path).name}",
                label=f"{d.model} block={d.block} step={d.step} grid={'x'.join(map(str, d.grid))}",
                q=q.contiguous(), k=k.contiguous(), v=v.contiguous(),
                segments=get_rope_facts(d.family).segments(head_dim), head_dim=head_dim,
                block=d.block, kv_len=d.kv_len,
            )  # fmt: skip
        )
    return cases


def _rotation_for(spec: str, case: StudyCase) -> Rotation:
    rot = make_rotation(spec, case.head_dim, case.segments)
    if isinstance(rot, PairRotation) and rot.lead_shape:
        if case.block is None:
            raise ValueError(f"{spec}: a per-block learned rotation needs dumps (which carry the block index)")
        rot = rot.select(case.block)
    return rot


def _exact_attention(case: StudyCase) -> torch.Tensor:
    kv_lens = None if case.kv_len is None else torch.full((case.q.shape[0],), case.kv_len)
    q, k, v = case.q.double(), case.k.double(), case.v.double()
    return attention_reference(q, k, v, recipe="fp16", kv_lens=kv_lens, smooth_k=False)


def run_case(case: StudyCase, rotations, recipes, v_hadamard: bool, block_n: int | None = None,
             smoothing: dict | None = None) -> list[dict]:
    """All settings on one tensor set; one row per (rotation, recipe). ``block_n``: the key-block size
    (part of the numerics; None: the reference default, 64; the Hopper kernel uses 128). ``smoothing``:
    ``smooth_q`` / ``smooth_v`` passed to the reference (default: the reference's, K only)."""
    ref = _exact_attention(case)
    kv_lens = None if case.kv_len is None else torch.full((case.q.shape[0],), case.kv_len)
    h = hadamard_matrix(case.head_dim, torch.float32) if v_hadamard else None
    v_in = case.v @ h if v_hadamard else case.v
    rows = []
    for spec in rotations:
        rot = _rotation_for(spec, case)
        q, k = rot.apply(case.q), rot.apply(case.k)
        psi = incoherence_summary(incoherence(q), case.segments)["all"]["peak_to_mean"]
        for recipe in recipes:
            out = attention_reference(q, k, v_in, recipe=recipe, kv_lens=kv_lens, block_n=block_n or DEFAULT_BLOCK_N,
                                      **(smoothing or {}))
            if v_hadamard:
                out = out @ h.T
            rows.append(
                {
                    "source": case.source, "case": case.label, "rotation": spec, "recipe": recipe,
                    "p": P_MODE.get(recipe, "?"), "v_hadamard": v_hadamard,
                    "cosine": metrics.cosine_similarity(ref, out), "rel_l2": metrics.relative_l2(ref, out),
                    "sqnr_db": metrics.sqnr_db(ref, out), "q_psi_peak_to_mean": psi,
                }  # fmt: skip
            )
    return rows


def aggregate(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """Mean and worst of each metric over cases, grouped by ``keys`` (first-seen order)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        agg = dict(zip(keys, key))
        agg["n"] = len(rs)
        agg["cos_mean"] = mean(r["cosine"] for r in rs)
        agg["cos_worst"] = min(r["cosine"] for r in rs)
        agg["rel_l2_mean"] = mean(r["rel_l2"] for r in rs)
        agg["rel_l2_worst"] = max(r["rel_l2"] for r in rs)
        agg["sqnr_mean"] = mean(r["sqnr_db"] for r in rs)
        agg["sqnr_worst"] = min(r["sqnr_db"] for r in rs)
        agg["psi_mean"] = mean(r["q_psi_peak_to_mean"] for r in rs)
        out.append(agg)
    return out


def format_main_table(aggs: list[dict]) -> str:
    lines = [
        "| source | recipe | P | rotation | n | cos mean | cos worst | rel L2 mean | rel L2 worst | SQNR dB mean | SQNR dB worst | Ψ(Q) peak/mean |",
        "| --- | --- | --- | --- | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for a in aggs:
        lines.append(
            f"| {a['source']} | {a['recipe']} | {P_MODE.get(a['recipe'], '?')} | {a['rotation']} | {a['n']} | "
            f"{a['cos_mean']:.5f} | {a['cos_worst']:.5f} | {a['rel_l2_mean']:.4f} | {a['rel_l2_worst']:.4f} | "
            f"{a['sqnr_mean']:.2f} | {a['sqnr_worst']:.2f} | {a['psi_mean']:.2f} |"
        )
    return "\n".join(lines)


def format_best(aggs: list[dict]) -> str:
    """Per (source, recipe): the rotation with the best mean SQNR and its gain over none."""
    lines = ["| source | recipe | best rotation (mean SQNR) | gain vs none, dB | half vs none, dB | interleaved vs none, dB |",
             "| --- | --- | --- | --: | --: | --: |"]  # fmt: skip
    by = {}
    for a in aggs:
        by.setdefault((a["source"], a["recipe"]), {})[a["rotation"]] = a["sqnr_mean"]
    for (source, recipe), d in by.items():
        best = max(d, key=d.get)
        base = d.get("none")

        def gain(name):
            return f"{d[name] - base:+.2f}" if base is not None and name in d else "-"

        lines.append(f"| {source} | {recipe} | {best} | {gain(best)} | {gain('half')} | {gain('interleaved')} |")
    return "\n".join(lines)


def format_v_table(aggs: list[dict]) -> str:
    lines = ["| source | recipe | V Hadamard | cos mean | rel L2 mean | SQNR dB mean | SQNR dB worst |",
             "| --- | --- | --- | --: | --: | --: | --: |"]  # fmt: skip
    for a in aggs:
        lines.append(
            f"| {a['source']} | {a['recipe']} | {'on' if a['v_hadamard'] else 'off'} | {a['cos_mean']:.5f} | "
            f"{a['rel_l2_mean']:.4f} | {a['sqnr_mean']:.2f} | {a['sqnr_worst']:.2f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(DEFAULT_FAMILIES), help="synthetic RoPE families (comma list, '' for none)")
    p.add_argument("--grids", default=",".join("x".join(map(str, g)) for g in DEFAULT_GRIDS), help="token grids FxHxW, comma list")
    p.add_argument("--seeds", type=int, default=3, help="synthetic seeds per family and grid")
    p.add_argument("--heads", type=int, default=2, help="heads per synthetic tensor set")
    p.add_argument("--rotations", default=",".join(DEFAULT_ROTATIONS), help="Q/K rotations (make_rotation specs, comma list)")
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES), help="reference recipes, comma list")
    p.add_argument("--v-hadamard", choices=("on", "off"), default="on", help="per-head Hadamard on V in the main table")
    p.add_argument("--no-v-table", action="store_true", help="skip the V Hadamard off/on table")
    p.add_argument("--dump", action="append", default=[], help="a Q/K/V dump (.safetensors from rotvid.rope.dumps); repeatable")
    p.add_argument("--max-query-tokens", type=int, default=2048, help="queries kept per dump (evenly spaced); keys all kept")
    p.add_argument("--max-heads", type=int, default=8, help="heads kept per dump")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--block-n", type=int, default=None,
                   help="key-block size of the quantized recipes (default: the reference's, 64; the Hopper kernel's is 128)")
    p.add_argument("--smooth-q", action="store_true", help="Q smoothing (per block of 128 query rows, with ΔS)")
    p.add_argument("--smooth-v", action="store_true", help="V smoothing (mean added back to the output)")
    p.add_argument("--q-block", type=int, default=128,
                   help="query rows per Q-smoothing mean (default 128, the kernels' tile; 0: one mean per head over all queries)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the results files go")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    families = [f for f in args.families.split(",") if f]
    for f in families:
        if f not in HEAD_DIMS:
            raise SystemExit(f"--families: unknown family {f!r} (known: {', '.join(HEAD_DIMS)})")
    grids = [parse_grid(g) for g in args.grids.split(",") if g]
    rotations = [r for r in args.rotations.split(",") if r]
    recipes = [r for r in args.recipes.split(",") if r]
    t0 = time.time()
    cases = synthetic_cases(families, grids, args.seeds, args.heads) + dump_cases(args.dump, args.max_query_tokens, args.max_heads)
    if not cases:
        raise SystemExit("nothing to study: give --families and/or --dump")
    v_on = args.v_hadamard == "on"
    rows, v_rows, exact = [], [], []
    for i, case in enumerate(cases):
        smoothing = dict(smooth_q=args.smooth_q, smooth_v=args.smooth_v,
                         q_block=args.q_block if args.q_block > 0 else None)
        rows += run_case(case, rotations, recipes, v_on, args.block_n, smoothing)
        # exactness check: unquantized attention of every rotation against float64.
        exact += run_case(case, rotations, ["fp16"], v_on)
        if not args.no_v_table:
            v_rows += run_case(case, ["none"], recipes, not v_on, args.block_n, smoothing)
        print(f"[{i + 1}/{len(cases)}] {case.source} {case.label}  ({time.time() - t0:.0f}s)", file=sys.stderr)
    aggs = aggregate(rows, ("source", "recipe", "rotation"))
    v_aggs = aggregate([r for r in rows if r["rotation"] == "none"] + v_rows, ("source", "recipe", "v_hadamard"))
    sources = list(dict.fromkeys(c.source for c in cases))
    v_aggs.sort(key=lambda a: (sources.index(a["source"]), recipes.index(a["recipe"]), a["v_hadamard"]))
    fp_worst = min(r["sqnr_db"] for r in exact)
    elapsed = time.time() - t0
    commit = git_commit()
    header = (
        f"# Accuracy study ({local_stamp()}, commit {commit})\n\n"
        f"command: `{command_line('accuracy_study', argv)}`  \n"
        f"cases: {len(cases)} tensor sets ({', '.join(sorted({c.source for c in cases}))}); "
        f"V Hadamard in main table: {args.v_hadamard}; key block {args.block_n or 'reference default (64)'}; "
        f"smoothing: K{(', Q per ' + (str(args.q_block) + ' rows' if args.q_block > 0 else 'head')) if args.smooth_q else ''}{', V' if args.smooth_v else ''}; "
        f"torch threads {args.threads}; {elapsed:.0f} s\n\n"
        f"Reference: exact float64 attention of the unrotated tensors. Worst SQNR of unquantized "
        f"(recipe fp16, float32) attention over all rotations: {fp_worst:.1f} dB (rotations are exact).\n"
    )
    text = "\n".join([
        header,
        "## Rotation × recipe (mean and worst over tensor sets)\n",
        format_main_table(aggs),
        "\n## Which rotation helps (mean SQNR)\n",
        format_best(aggs),
    ])  # fmt: skip
    if v_aggs and not args.no_v_table:
        text += "\n\n## V Hadamard off/on (no Q/K rotation)\n\n" + format_v_table(v_aggs)
    print(text)
    result = {"text": text, "rows": rows, "v_rows": v_rows, "exact_rows": exact, "commit": commit, "elapsed_s": elapsed}
    if not args.no_write:
        stem = write_results(args.out_dir, "accuracy", commit, text, {k: v for k, v in result.items() if k != "text"})
        print(f"\nwrote {stem}.md and .json", file=sys.stderr)
        result["written"] = str(stem)
    return result


if __name__ == "__main__":
    main()
