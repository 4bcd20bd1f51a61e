"""Old vs new Hopper attention kernels without a GPU: per shipping instantiation, ptxas resources (registers,
spills, stack, barriers), dynamic shared memory, and the PTX and SASS instruction histograms.

    python benchmarks/kernel_ptx_diff.py --old-rev aa5d692               # old: that commit's csrc, new: this tree's
    python benchmarks/kernel_ptx_diff.py --old OLD_CSRC --new NEW_CSRC   # two csrc folders

Each tree's Hopper launchers (the ``.cu`` files of its csrc folder that include ``tma_map.cuh`` or
``hopper_launch.cuh``) are compiled as the extension builds them for sm90a, ``nvcc -std=c++17 -O3
-gencode=arch=compute_90a,code=sm_90a``, once with ``-Xptxas -v -c`` and once with ``-ptx``, so the kernels compared
are exactly the instantiations the launchers ship. Kernel names are demangled (``c++filt``) and matched across trees
by what they compute -- numerics, head_dim, block_n, P mode, Q smoothing (:data:`FAMILIES`); the schedule column
shows each tree's (stages, ping-pong, pipe). Dynamic shared memory is each tree's own constant (``Cfg::SMEM`` /
``SmemLayout::SMEM``), printed by a small host program. "PTX numeric ops in the same order" compares the sequence of
the instructions that decide the output's bits (:data:`NUMERIC_OPS`: float arithmetic, conversions, ex2, wgmma,
shuffles, dp4a). SASS comes from ``cuobjdump -sass`` (on PATH, or the one
triton ships); "SASS same" means the instruction sequences are equal, operands included; otherwise it counts the new
listing's instructions outside the longest common opcode subsequence (moved or changed).

Exits 1 when a kernel of the old tree is missing from the new one, its registers, spills, stack or shared memory
differ (spills that both trees have are shown, not failed) or its numeric ops differ in kind or order;
instruction-count deltas are printed (opcode: old -> new) for the reader to explain. A kernel only the new tree has
(the block-sparse instantiations, ``SPARSE = true``, keyed "... sparse") is listed with its own resources.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import importlib.util
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CSRC = "rotvid/kernels/csrc"
NVCC_FLAGS = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a"]
LAUNCHER_INCLUDES = re.compile(r'#include "(tma_map|hopper_launch)\.cuh"')


@dataclass(frozen=True)
class Family:
    """Kernels of one template, before or after the refactor: how to read their key and their shared memory."""

    pattern: re.Pattern  # on the demangled name
    key: str  # format of the match's groups: what the kernel computes
    schedule: str  # format of the match's groups: the kernel's (stages, ping-pong, pipe)
    headers: tuple[str, ...]  # headers that define the shared-memory constant
    smem: str | None  # C++ expression of the dynamic shared memory, formatted with the match's groups
    sparse_group: int | None = None  # the group of the SPARSE template flag ("true": key + " sparse"; absent or
    # "false": the dense kernel, the same key as a tree from before the flag)

    def key_of(self, m: re.Match) -> str:
        key = self.key.format(*m.groups())
        if self.sparse_group is not None and m.group(self.sparse_group) == "true":
            key += " sparse"
        return key


_B = r"(true|false)"
FAMILIES = (
    # aa5d692: int4_attention_wgmma_kernel<D, BN, PMODE, STAGES, PINGPONG, PIPE, SQ, FP8PV>
    Family(re.compile(r"rotvid::wg::int4_attention_wgmma_kernel<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), " + _B
                      + r", (\d+)>"),
           "int4 d{0} bn{1} pmode{2} sq={6}", "{3},{4},{5}", ("int4_attention_wgmma.cuh",),
           "rotvid::wg::Cfg<{0}, {3}, {1}>::SMEM"),
    # aa5d692: int8fp8_attention_wgmma_kernel<D, BN, STAGES, PINGPONG, PIPE, NWG, MAGIC>
    Family(re.compile(r"rotvid::wg8::int8fp8_attention_wgmma_kernel<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)>"),
           "int8fp8 d{0} bn{1}", "{2},{3},{4} magic={6}", ("int8fp8_attention_wgmma.cuh",),
           "rotvid::wg8::Cfg<{0}, {2}, {1}, {5}>::SMEM"),
    # hopper_attention_kernel<Int4ValuedNumerics<D, BN, PMODE, SQ>, STAGES, PINGPONG, PIPE[, SPARSE]>
    Family(re.compile(r"rotvid::hopper::hopper_attention_kernel<rotvid::hopper::Int4ValuedNumerics<(\d+), (\d+), "
                      r"(\d+), " + _B + r">, (\d+), (\d+), (\d+)(?:, " + _B + r")?>"),
           "int4 d{0} bn{1} pmode{2} sq={3}", "{4},{5},{6}", ("hopper_attention.cuh", "hopper_int4_numerics.cuh"),
           "rotvid::hopper::SmemLayout<rotvid::hopper::Int4ValuedNumerics<{0}, {1}, {2}, {3}>, {4}>::SMEM", 8),
    # hopper_attention_kernel<Int8Fp8Numerics<D, MAGIC>, STAGES, PINGPONG, PIPE[, SPARSE]>
    Family(re.compile(r"rotvid::hopper::hopper_attention_kernel<rotvid::hopper::Int8Fp8Numerics<(\d+), " + _B
                      + r">, (\d+), (\d+), (\d+)(?:, " + _B + r")?>"),
           "int8fp8 d{0} bn128", "{2},{3},{4} magic={1}", ("hopper_attention.cuh", "hopper_int8fp8_numerics.cuh"),
           "rotvid::hopper::SmemLayout<rotvid::hopper::Int8Fp8Numerics<{0}, {1}>, {2}>::SMEM", 6),
    # combine_splits_kernel<D[, SPARSE]>
    Family(re.compile(r"rotvid::(?:wg|hopper)::combine_splits_kernel<(\d+)(?:, " + _B + r")?>"), "combine d{0}", "",
           (), None, 2),
)


@dataclass
class Kernel:
    name: str  # demangled
    key: str
    schedule: str
    resources: dict = field(default_factory=dict)  # registers, spill_stores, spill_loads, stack, barriers
    smem: int | None = None
    ptx: collections.Counter = field(default_factory=collections.Counter)
    numeric: list = field(default_factory=list)  # the PTX's NUMERIC_OPS in order
    sass: list = field(default_factory=list)  # instruction texts in order


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise SystemExit(f"kernel_ptx_diff: command failed: {' '.join(cmd)}\n{res.stderr}")
    return res


def demangle(names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    filt = shutil.which("c++filt")
    if filt is None:
        raise SystemExit("kernel_ptx_diff: c++filt not found (binutils): kernel names cannot be demangled")
    out = run([filt], input="\n".join(names) + "\n").stdout.splitlines()
    return dict(zip(names, out))


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin is not None:
        cand = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    return None


# PTX instructions that decide the output's bits: float arithmetic, comparisons and conversions, ex2, the integer
# max (int8-fp8's row max) and row sums (dp4a), shuffles, the tensor-core products
NUMERIC_OPS = re.compile(r"^(fma|mul|add|sub|neg|abs|min|max|div|rcp|sqrt|selp|setp)\.(\w+\.)*f32|^(min|max)\.s32"
                         r"|^(ex2|cvt\.rn|wgmma\.mma_async|shfl|dp4a)")


def ptx_opcodes(ptx: str) -> dict[str, list[str]]:
    """Opcodes (full, with their suffixes) in order per .entry of a PTX file."""
    heads = list(re.finditer(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(", ptx, re.M))
    out = {}
    for i, m in enumerate(heads):
        body = ptx[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(ptx)]
        body = body[body.index("{") + 1:] if "{" in body else body
        ops = []
        for line in body.splitlines():
            line = line.split("//")[0].strip()
            if not line or line[0] in ".{}()" or line.endswith(":"):
                continue
            tok = line.split()
            if tok[0].startswith("@"):
                tok = tok[1:]
            if tok:
                ops.append(tok[0].rstrip(";"))
        out[m.group(1)] = ops
    return out


def sass_listings(dump: str) -> dict[str, list[str]]:
    """Instruction texts (address and encoding stripped) per function of a cuobjdump -sass listing."""
    out, cur = {}, None
    for line in dump.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;\s*/\*", line)
        if m and cur is not None:
            cur.append(re.sub(r"\s+", " ", m.group(1)))
    return out


def sass_opcode(instr: str) -> str:
    tok = instr.split()
    if tok and tok[0].startswith("@"):
        tok = tok[1:]
    return tok[0] if tok else ""


def parse_ptxas(log: str) -> dict[str, dict]:
    res, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line) or re.search(r"Function properties for (\S+)", line)
        if m:
            cur = res.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
        m = re.search(r"used (\d+) barriers", line)
        if m:
            cur["barriers"] = int(m.group(1))
    return res


def classify(name: str) -> tuple[Family, re.Match] | None:
    for fam in FAMILIES:
        m = fam.pattern.search(name)
        if m:
            return fam, m
    return None


def build_tree(csrc: Path, work: Path, objdump: str | None) -> dict[str, Kernel]:
    """Every kernel of the tree's Hopper launchers, keyed by what it computes."""
    sources = sorted(f for f in csrc.glob("*.cu") if LAUNCHER_INCLUDES.search(f.read_text()))
    if not sources:
        raise SystemExit(f"kernel_ptx_diff: no Hopper launcher (.cu including tma_map.cuh / hopper_launch.cuh) in {csrc}")
    mangled_res, mangled_ptx, mangled_sass = {}, {}, {}
    for src in sources:
        obj, ptx = work / (src.stem + ".o"), work / (src.stem + ".ptx")
        log = run(["nvcc", *NVCC_FLAGS, "-Xptxas", "-v", "-c", str(src), "-o", str(obj)]).stderr
        mangled_res.update(parse_ptxas(log))
        run(["nvcc", *NVCC_FLAGS, "-ptx", str(src), "-o", str(ptx)])
        mangled_ptx.update(ptx_opcodes(ptx.read_text()))
        if objdump:
            mangled_sass.update(sass_listings(run([objdump, "-sass", str(obj)]).stdout))
    names = demangle(sorted(set(mangled_res) | set(mangled_ptx)))
    kernels: dict[str, Kernel] = {}
    smem_exprs = {}
    for mangled, pretty in names.items():
        found = classify(pretty)
        if found is None:
            print(f"  (not compared: {pretty})")
            continue
        fam, m = found
        ops = mangled_ptx.get(mangled, [])
        k = Kernel(pretty, fam.key_of(m), fam.schedule.format(*m.groups()),
                   mangled_res.get(mangled, {}), None, collections.Counter(ops),
                   [op for op in ops if NUMERIC_OPS.match(op)], mangled_sass.get(mangled, []))
        kernels[k.key] = k
        if fam.smem:
            smem_exprs[k.key] = (fam.headers, fam.smem.format(*m.groups()))
    if smem_exprs:  # each kernel's dynamic shared memory, as the tree's own constant
        headers = list(dict.fromkeys(h for hs, _ in smem_exprs.values() for h in hs))
        prog = work / "smem.cu"
        prog.write_text("#include <cstdio>\n" + "".join(f'#include "{h}"\n' for h in headers) + "int main() {\n"
                        + "".join(f'  std::printf("%s\\t%d\\n", "{key}", (int)({expr}));\n'
                                  for key, (_, expr) in smem_exprs.items()) + "}\n")
        exe = work / "smem"
        run(["nvcc", *NVCC_FLAGS, "-I", str(csrc), str(prog), "-o", str(exe)])
        for line in run([str(exe)]).stdout.splitlines():
            key, val = line.split("\t")
            kernels[key].smem = int(val)
    return kernels


def delta(old: collections.Counter, new: collections.Counter) -> str:
    ops = sorted(set(old) | set(new))
    return ", ".join(f"{op}: {old[op]} -> {new[op]}" for op in ops if old[op] != new[op])


def export_rev(rev: str, dest: Path) -> Path:
    archive = dest / "csrc.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, CSRC], stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "tree")
    return dest / "tree" / CSRC


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, help="the old tree's csrc folder")
    ap.add_argument("--old-rev", help="or a git revision of this repository whose csrc is the old tree")
    ap.add_argument("--new", type=Path, default=REPO / CSRC, help="the new tree's csrc folder (default: this tree's)")
    args = ap.parse_args()
    if (args.old is None) == (args.old_rev is None):
        ap.error("give exactly one of --old, --old-rev")
    objdump = cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old_csrc = export_rev(args.old_rev, tmp) if args.old_rev else args.old
        trees = {}
        for label, csrc in (("old", old_csrc), ("new", args.new)):
            (tmp / label).mkdir()
            print(f"building the {label} tree's Hopper launchers ({csrc}) ...", flush=True)
            trees[label] = build_tree(Path(csrc).resolve(), tmp / label, objdump)
    old, new = trees["old"], trees["new"]
    bad = False
    print("\n| kernel | schedule old / new | registers | spill st / ld | stack | barriers | dyn. smem B | "
          "PTX instr. old / new | PTX numeric ops in the same order | SASS instr. old / new | SASS same |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    details = []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            print(f"| {key} | only in the old tree | | | | | | | | | |")
            bad = True
            continue
        if key not in old:  # a kernel the new tree adds (e.g. the block-sparse instantiations): nothing to compare
            r = new[key].resources
            print(f"| {key} | new: {new[key].schedule} | {r.get('registers')} | "
                  f"{(r.get('spill_stores'), r.get('spill_loads'))} | {r.get('stack')} | {r.get('barriers')} | "
                  f"{new[key].smem} | {sum(new[key].ptx.values())} | ({len(new[key].numeric)}) | "
                  f"{len(new[key].sass)} | |")
            continue
        o, n = old[key], new[key]

        def pair(a, b):
            return f"{a}" if a == b else f"**{a} / {b}**"

        ro, rn = o.resources, n.resources
        same_res = all(ro.get(f) == rn.get(f) for f in ("registers", "spill_stores", "spill_loads", "stack")) and \
            o.smem == n.smem
        bad |= not same_res or o.numeric != n.numeric
        if objdump is None:
            sass_same = "n/a (no cuobjdump)"
        elif o.sass == n.sass:
            sass_same = "yes"
        else:  # instructions of the new listing outside the longest matching opcode runs
            ops_o, ops_n = [sass_opcode(i) for i in o.sass], [sass_opcode(i) for i in n.sass]
            matched = sum(b.size for b in difflib.SequenceMatcher(None, ops_o, ops_n, autojunk=False).get_matching_blocks())
            sass_same = f"no: {len(ops_n) - matched} moved or changed"
        print(f"| {key} | {o.schedule} / {n.schedule} | {pair(ro.get('registers'), rn.get('registers'))} | "
              f"{pair((ro.get('spill_stores'), ro.get('spill_loads')), (rn.get('spill_stores'), rn.get('spill_loads')))} | "
              f"{pair(ro.get('stack'), rn.get('stack'))} | {pair(ro.get('barriers'), rn.get('barriers'))} | "
              f"{pair(o.smem, n.smem)} | {sum(o.ptx.values())} / {sum(n.ptx.values())} | "
              f"{'yes' if o.numeric == n.numeric else 'NO'} ({len(n.numeric)}) | "
              f"{len(o.sass)} / {len(n.sass)} | {sass_same} |")
        d_ptx = delta(o.ptx, n.ptx)
        d_sass = delta(collections.Counter(map(sass_opcode, o.sass)), collections.Counter(map(sass_opcode, n.sass)))
        if d_ptx or d_sass:
            details.append(f"- {key}: PTX {{{d_ptx or 'same'}}}; SASS {{{d_sass or 'same'}}}")
    print("\nOpcode deltas (old -> new):" if details else "\nPTX and SASS opcode histograms identical for every kernel.")
    print("\n".join(details))
    if bad:
        print("\nkernel_ptx_diff: a kernel is missing from one tree, or its resources differ or spill (see the table)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
