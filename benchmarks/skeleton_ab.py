"""Old kernels against new on one GPU: the same bits on every kernel configuration, and the same speed.

Bits (each tree in its own process, the rotvid on ``PYTHONPATH`` / the tree the script is run from)::

    python -m benchmarks.skeleton_ab dump OUT.json        # every configuration's output hash, fixed inputs
    python -m benchmarks.skeleton_ab compare OLD.json NEW.json

``dump`` runs every recipe x kernel path x head_dim {64, 128} x layout x kv_lens x smoothing switch (and, for
INT4, P mode and key-block size) on fixed seeded inputs, at two sizes (one whose last wave of query tiles is
split over the keys on a 132-SM GPU, one not), and records a SHA-256 of each output's bytes, its NaN count and
float64 sums. ``compare`` lists every configuration whose bits differ and exits 1 if any does.

Speed: ``kernel_bench.py --rows-json`` run in each tree (alternating, in one device call) gives per-method times;
``table`` pairs them into ``benchmarks/results/skeleton_ab.json``::

    python -m benchmarks.skeleton_ab table --old OLD_ROWS.json... --new NEW_ROWS.json... \\
        --old-commit C1 --new-commit C2 --out benchmarks/results/skeleton_ab.json

(a method's time per tree is the minimum over the runs given; the rows are every rotvid row of kernel_bench,
attention-only rows included, plus cuDNN and SageAttention2-8b, whose old/new columns are the same baseline timed
in the two runs and show the run-to-run noise.)
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from pathlib import Path

SIZES = ((1000, 1000), (300, 777))  # (n_q, n_kv): 48 tiles of 128 rows at B 2 x H 3 -> the tail split; and not


def _inputs(seed: int, n_q: int, n_kv: int, d: int, layout: str, kv_cut: bool):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h = 2, 3

    def make(n):
        shape = (b, h, n, d) if layout == "BHND" else (b, n, h, d)
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)

    q, k, v = make(n_q), make(n_kv), make(n_kv)
    k = k + 0.5  # a channel bias, as real keys have
    kv_lens = torch.tensor([n_kv, n_kv - n_kv // 3 - 5], dtype=torch.int32, device="cuda") if kv_cut else None
    return q, k, v, kv_lens


def _record(out) -> dict:
    import torch

    t = out.detach().contiguous()
    return {"sha256": hashlib.sha256(t.view(torch.uint8).cpu().numpy().tobytes()).hexdigest(),
            "nan": int(torch.isnan(t).sum()), "sum": float(t.double().sum()), "abs": float(t.double().abs().sum())}


def configurations():
    """Every (recipe, options) pair the dump runs, as (name, recipe, kwargs, shape options)."""
    for (n_q, n_kv), d, layout, kv_cut in itertools.product(SIZES, (64, 128), ("BHND", "BNHD"), (False, True)):
        shape = dict(n_q=n_q, n_kv=n_kv, d=d, layout=layout, kv_cut=kv_cut)
        for path, (sk, sv) in itertools.product(("wgmma", "mma"), ((True, False), (True, True), (False, False))):
            yield "int8-fp8", dict(path=path, smooth_k=sk, smooth_v=sv), shape
        for path, bn, pm, sq, sv in itertools.product(("wgmma", "s8", "s4"), (64, 128), ("range", "sym"),
                                                      (False, True), (False, True)):
            yield "int4", dict(path=path, block_n=bn, p_mode=pm, smooth_q=sq, smooth_v=sv), shape


def hash_outputs() -> dict:
    """Every configuration's output record (sha256, NaN count, float64 sums; or the error a path refused it with)."""
    import torch

    from rotvid.kernels.recipes.int4.ops import int4_attention_cuda
    from rotvid.kernels.recipes.int8_fp8.ops import int8fp8_attention_cuda

    records = {}
    for i, (recipe, opts, shape) in enumerate(configurations()):
        name = f"{recipe} " + " ".join(f"{k}={v}" for k, v in {**opts, **shape}.items())
        q, k, v, kv_lens = _inputs(1000 + i, shape["n_q"], shape["n_kv"], shape["d"], shape["layout"], shape["kv_cut"])
        try:
            if recipe == "int8-fp8":
                o = int8fp8_attention_cuda(q, k, v, layout=shape["layout"], kv_lens=kv_lens, **opts)
            else:
                o = int4_attention_cuda(q, k, v, layout=shape["layout"], kv_lens=kv_lens, **opts)
            torch.cuda.synchronize()
            records[name] = _record(o)
        except (RuntimeError, ValueError) as err:  # a configuration a path does not take: the same in both trees
            records[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
    return records


def dump(out: Path) -> int:
    import torch

    records = hash_outputs()
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "records": records}, indent=1) + "\n")
    ran = sum("sha256" in r for r in records.values())
    print(f"skeleton_ab dump: {ran} configurations ran, {len(records) - ran} refused; wrote {out}")
    return 0


def compare(old: Path, new: Path) -> int:
    a, b = (json.loads(p.read_text())["records"] for p in (old, new))
    if set(a) != set(b):
        print(f"skeleton_ab compare: different configuration sets ({len(set(a) ^ set(b))} differ)")
        return 1
    differ = [n for n in a if a[n] != b[n]]
    ran = sum("sha256" in r for r in a.values())
    nan = [n for n in b if b[n].get("nan")]
    for n in differ[:40]:
        print(f"DIFFERS {n}: old {a[n]} new {b[n]}")
    for n in nan[:10]:
        print(f"NaN in {n}: {b[n]}")
    print(f"skeleton_ab compare: {len(a)} configurations ({ran} ran), {len(differ)} differ, {len(nan)} with NaN")
    return 1 if differ or nan else 0


def table(old: list[Path], new: list[Path], old_commit: str, new_commit: str, out: Path) -> int:
    def best(paths):
        runs = [json.loads(p.read_text()) for p in paths]
        t: dict = {}
        for run in runs:
            for r in run["rows"]:
                if r.get("ms") is not None:
                    key = (r["shape"], r["method"])
                    t[key] = min(t.get(key, float("inf")), r["ms"])
        return runs[0]["device"], t

    dev_old, to = best(old)
    dev_new, tn = best(new)
    if dev_old != dev_new:
        print(f"skeleton_ab table: old runs on {dev_old}, new on {dev_new}: not one GPU")
        return 1
    rows = [{"shape": s, "method": m, "old_ms": round(to[(s, m)], 4), "new_ms": round(tn[(s, m)], 4)}
            for (s, m) in to if (s, m) in tn]
    result = {"device": dev_new, "old_commit": old_commit, "new_commit": new_commit, "rows": rows}
    tmp = out.with_suffix(".json.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    worst = 0.0
    print(f"| shape | method | old ms | new ms | new/old |\n|---|---|---|---|---|")
    for r in rows:
        ratio = r["new_ms"] / r["old_ms"]
        if r["method"].startswith("rotvid"):
            worst = max(worst, ratio)
        print(f"| {r['shape']} | {r['method']} | {r['old_ms']:.3f} | {r['new_ms']:.3f} | {ratio:.4f} |")
    print(f"skeleton_ab table: worst rotvid new/old {worst:.4f}; wrote {out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    t = sub.add_parser("table")
    t.add_argument("--old", type=Path, nargs="+", required=True)
    t.add_argument("--new", type=Path, nargs="+", required=True)
    t.add_argument("--old-commit", required=True)
    t.add_argument("--new-commit", required=True)
    t.add_argument("--out", type=Path, default=Path("benchmarks/results/skeleton_ab.json"))
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        return dump(args.out)
    if args.cmd == "compare":
        return compare(args.old, args.new)
    return table(args.old, args.new, args.old_commit, args.new_commit, args.out)


if __name__ == "__main__":
    sys.exit(main())
