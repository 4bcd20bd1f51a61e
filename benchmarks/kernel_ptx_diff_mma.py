"""Old vs new mma.sync attention kernels without a GPU: per shipping instantiation, ptxas resources (registers,
spills, stack), the PTX and SASS opcode histograms and how many lines of their texts differ (registers, labels and
mangled names renumbered, so 0 means the same code).

    python benchmarks/kernel_ptx_diff_mma.py --old aa5d692 [--new ROOT] [--archs 80,86,89,90a] [--sass]

``--old`` is a git revision (its ``rotvid/kernels/csrc`` is exported with ``git archive``); ``--new`` the working
tree (default). Every launcher source (``attn_s4_d64.cu`` ...) is compiled with the flags of ``.ci/compile_cuda``,
once with ``-ptx`` and once to an object with ``-Xptxas -v``; kernels of old and new are paired by :func:`kernel_key`
(numerics, head_dim, block_n, path, P mode and schedule), so a kernel without a partner means the schedule changed
(except a block-sparse instantiation, ``SPARSE = true``, keyed "... sparse": listed with its resources, not failed;
the dense one, ``SPARSE = false``, has the key of the kernel from before the flag).
SASS needs ``cuobjdump`` on PATH or in ``$CUOBJDUMP``. Exit status 1 when any pair differs in resources or in an
opcode histogram; "(order)" after a count of differing lines: the same lines, some in another order.

The functions (``compile_unit``, ``ptx_entries``, ``opcode_histogram``, ``sass_entries``) take no kernel-specific
argument: :data:`KEYS` is the only part that knows the mma.sync kernels' names.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = "rotvid/kernels/csrc"
UNITS = ("attn_s4_d64.cu", "attn_s4_d128.cu", "attn_s8_d64.cu", "attn_s8_d128.cu", "attn_int8fp8_mma.cu")

def _walk_key(kind: str, n: int):
    """The key of ``mma_attention_kernel<..., SPARSE>`` whose first ``n`` integer arguments come before the SPARSE
    flag: the dense instantiation keyed as the kernel from before the flag, the block-sparse one with "sparse"."""

    def key(a: tuple) -> tuple:
        if len(a) > n:
            return (kind, *a[:n], "sparse") if a[n] else (kind, *a[:n])
        return (kind, *a)

    return key


# mangled kernel name -> comparable key: (pattern, key of the template's integer arguments in order)
KEYS = (
    # before the skeleton: int4_attention_kernel<D, BN, S4, PMODE, NW, MINB, STAGES, LEAN>
    (re.compile(r"int4_attention_kernel"), lambda a: ("int4", *a)),
    # int8fp8_attention_mma_kernel<D, NW, MINB> (2 stages, not lean)
    (re.compile(r"int8fp8_attention_mma_kernel"), lambda a: ("int8fp8", *a, 2, 0)),
    # mma_attention_kernel<Int4Numerics<D, BN, S4, PMODE>, NW, MINB, STAGES, LEAN[, SPARSE]>
    (re.compile(r"mma_attention_kernel.*Int4Numerics"), _walk_key("int4", 8)),
    # mma_attention_kernel<Int8Fp8Numerics<D>, NW, MINB, STAGES, LEAN[, SPARSE]>
    (re.compile(r"mma_attention_kernel.*Int8Fp8Numerics"), _walk_key("int8fp8", 5)),
)


def kernel_key(mangled: str) -> tuple | None:
    """The comparable key of a mangled kernel name (its integer template arguments in order), None if unknown."""
    args = tuple(int(v) for v in re.findall(r"L[ib](\d+)E", mangled))
    for pattern, key in KEYS:
        if pattern.search(mangled):
            return key(args)
    return None


def export_tree(rev: str, dest: Path) -> Path:
    """``rotvid/kernels/csrc`` of git revision ``rev`` under ``dest``; returns the csrc folder."""
    data = subprocess.run(["git", "archive", rev, CSRC], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest / CSRC


def ptxas_resources(log: str) -> dict[str, dict[str, int]]:
    """Per kernel of a ``-Xptxas -v`` log: registers, spill stores / loads, stack frame (bytes)."""
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = {}
            continue
        if name is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[name].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[name]["regs"] = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            out[name]["smem"] = int(m.group(1)) if m else 0
    return out


def ptx_entries(ptx: str) -> dict[str, str]:
    """The body of every ``.entry`` of a PTX file, by mangled name."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+)\((.*?)\n\}\n", ptx, flags=re.S):
        out[m.group(1)] = m.group(2)
    return out


def _ptx_instructions(body: str) -> list[str]:
    lines = []
    for raw in body.splitlines():
        line = raw.split("//")[0].strip()
        if not line or line.startswith((".", "{", "}", ")")) or line.endswith(":"):
            continue
        lines.append(re.sub(r"^@!?%p\d+\s+", "", line))
    return lines


def _sass_instructions(body: str) -> list[str]:
    lines = []
    for raw in body.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", raw)
        if m:
            lines.append(re.sub(r"^@!?U?P\w+\s+", "", m.group(1)))
    return lines


def opcode_histogram(instructions: list[str]) -> collections.Counter:
    """Opcode (with its modifiers, e.g. ``ld.shared.v2.f32``) -> count."""
    return collections.Counter(line.split()[0] for line in instructions if line)


def canonical_text(body: str) -> str:
    """The instruction text with registers and labels renumbered in order of first use (a label's function index,
    ``$L__BB<function>_<block>``, dropped: it moves when instantiations are added to a file) and mangled names
    (kernel, parameters, shared-memory symbol) replaced: two texts equal here differ in names only."""
    seen: dict[str, str] = {}
    count: collections.Counter = collections.Counter()

    def rename(m: re.Match) -> str:
        name = m.group(0)
        if name not in seen:
            kind = re.sub(r"\d+(_\d+)?$", "", name)
            seen[name] = f"{kind}{count[kind]}"
            count[kind] += 1
        return seen[name]

    body = re.sub(r"\b_Z\w+", lambda m: "SYM" if "param" not in m.group(0) else "PARAM", body)
    return re.sub(r"%[a-z]+\d+|\$L__\w+|\bU?[RP]\d+\b", rename, body)


def sass_entries(obj: Path, cuobjdump: str) -> dict[str, str]:
    """SASS text per kernel of an object file (cuobjdump -sass)."""
    text = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    out = {}
    for m in re.finditer(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", text, flags=re.S):
        out[m.group(1)] = m.group(2)
    return out


def compile_unit(csrc: Path, unit: str, arch: str, work: Path, cuobjdump: str | None) -> dict[str, dict]:
    """Compile ``unit`` for ``arch`` (80, 89, 90a): per kernel its ptxas resources, PTX and (optionally) SASS."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "nvcc"
    gencode = f"-gencode=arch=compute_{arch},code=sm_{arch}"
    base = [nvcc, "-std=c++17", "-O3", gencode, str(csrc / unit)]
    tag = work / f"{unit}.{arch}"
    ptx = subprocess.run([*base, "-ptx", "-o", f"{tag}.ptx"], capture_output=True, text=True)
    if ptx.returncode != 0:
        raise RuntimeError(f"nvcc -ptx failed for {csrc / unit} sm_{arch}:\n{ptx.stderr}")
    obj = subprocess.run([*base, "-Xptxas", "-v", "-c", "-o", f"{tag}.o"], capture_output=True, text=True)
    if obj.returncode != 0:
        raise RuntimeError(f"nvcc -c failed for {csrc / unit} sm_{arch}:\n{obj.stderr}")
    res = ptxas_resources(obj.stdout + obj.stderr)
    bodies = ptx_entries(Path(f"{tag}.ptx").read_text())
    sass = sass_entries(Path(f"{tag}.o"), cuobjdump) if cuobjdump else {}
    out = {}
    for name, body in bodies.items():
        key = kernel_key(name)
        if key is None:
            continue
        out_sass = _sass_instructions(sass[name]) if name in sass else None
        out[key] = {"name": name, "res": res.get(name, {}), "ptx": _ptx_instructions(body), "sass": out_sass}
    return out


def text_diff_lines(old: list[str], new: list[str]) -> str:
    """Lines that differ (removed + added) between the canonical texts, "0" for the same code; "(order)" when the
    removed and the added lines are the same lines (the same instructions, some in another order)."""
    a = canonical_text("\n".join(old)).splitlines()
    b = canonical_text("\n".join(new)).splitlines()
    removed, added = collections.Counter(), collections.Counter()
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith("-") and not line.startswith("---"):
            removed[line[1:]] += 1
        elif line.startswith("+") and not line.startswith("+++"):
            added[line[1:]] += 1
    n = sum(removed.values()) + sum(added.values())
    return f"{n} (order)" if n and removed == added else str(n)


def compare(old: dict, new: dict) -> dict:
    """One row of the table: resources, histogram deltas (opcode: new - old), differing lines of the texts."""
    row = {"res_old": old["res"], "res_new": new["res"]}
    for kind in ("ptx", "sass"):
        if old[kind] is None or new[kind] is None:
            continue
        h_old, h_new = opcode_histogram(old[kind]), opcode_histogram(new[kind])
        row[kind] = {
            "n": (len(old[kind]), len(new[kind])),
            "delta": {op: h_new[op] - h_old[op] for op in sorted(set(h_old) | set(h_new)) if h_new[op] != h_old[op]},
            "diff_lines": text_diff_lines(old[kind], new[kind]),
        }
    return row


def _fmt_res(r: dict) -> str:
    return f"{r.get('regs', '?')}r/{r.get('spill_st', '?')}s/{r.get('stack', '?')}st" if r else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="git revision of the old kernels (e.g. the commit before a refactor)")
    ap.add_argument("--new", default=str(ROOT), help="repository root of the new kernels (default: this tree)")
    ap.add_argument("--archs", default="80,86,89,90a", help="comma-separated compute capabilities")
    ap.add_argument("--units", default=",".join(UNITS), help="launcher sources to compile")
    ap.add_argument("--sass", action="store_true", help="also compare SASS (needs cuobjdump)")
    args = ap.parse_args(argv)
    cuobjdump = None
    if args.sass:
        cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
        if not cuobjdump:
            ap.error("--sass needs cuobjdump on PATH or in $CUOBJDUMP")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old_csrc = export_tree(args.old, work / "old")
        new_csrc = Path(args.new) / CSRC
        head = ["arch", "unit", "kernel", "regs/spill/stack old", "new"]
        for kind in ("PTX", "SASS") if cuobjdump else ("PTX",):
            head += [f"{kind} instr old/new", f"{kind} histogram (new - old)", f"{kind} lines differing"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for arch in args.archs.split(","):
            for unit in args.units.split(","):
                old = compile_unit(old_csrc, unit, arch, work, cuobjdump)
                new = compile_unit(new_csrc, unit, arch, work, cuobjdump)
                for key in sorted(set(old) | set(new), key=str):
                    if key not in old and key[-1] == "sparse":  # a block-sparse kernel: nothing to compare
                        print(f"| sm_{arch} | {unit} | {key} | only in new | {_fmt_res(new[key]['res'])} |")
                        continue
                    if key not in old or key not in new:
                        failed = True
                        print(f"| sm_{arch} | {unit} | {key} | only in {'old' if key in old else 'new'} |")
                        continue
                    row = compare(old[key], new[key])
                    kinds = [row[k] for k in ("ptx", "sass") if k in row]
                    failed |= row["res_old"] != row["res_new"] or any(r["delta"] for r in kinds)
                    cells = []
                    for r in kinds:
                        cells += [f"{r['n'][0]}/{r['n'][1]}", str(r["delta"] or "same"), r["diff_lines"]]
                    print(f"| sm_{arch} | {unit} | {key} | {_fmt_res(row['res_old'])} | {_fmt_res(row['res_new'])} | "
                          + " | ".join(cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
