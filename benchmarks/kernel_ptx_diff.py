"""Old vs new attention kernels without a GPU, per shipping instantiation: ptxas resources (registers, spills, stack),
shared memory and the PTX and SASS instructions of one kernel family.

    python -m benchmarks.kernel_ptx_diff --family hopper --old-rev aa5d692              # that commit vs this tree
    python -m benchmarks.kernel_ptx_diff --family hopper --old OLD_TREE --new NEW_TREE  # two saved trees
    python -m benchmarks.kernel_ptx_diff --family mma --old-rev aa5d692 [--new ROOT] [--archs 80,86,89,90a] [--sass]
    python -m benchmarks.kernel_ptx_diff --family pre --old-rev aa5d692 [--archs 90a] [--sass]   # the pre-processing

``--old`` is a saved tree or a git revision of this repository (its ``rotvid/kernels``, exported with ``git
archive``; ``--old-rev`` names a revision only); ``--new`` a saved tree (default: this one). A tree is a repository
root, a ``rotvid/kernels`` folder (the shared ``csrc/`` and each recipe's ``recipes/<name>/csrc/``) or a csrc folder on
its own (the flat ``csrc`` of before the recipe folders); its sources are found by file name wherever they sit
(:class:`benchmarks.kernel_listing.KernelTree`). Each launcher source is compiled with the flags and the include folder
of the extension and ``.ci/compile_cuda`` (``nvcc -std=c++17 -O3 -gencode=arch=compute_X,code=sm_X -I
rotvid/kernels/csrc``; ``$NVCC`` or the nvcc on PATH), once with ``-ptx`` and once to an object with ``-Xptxas -v``,
so the kernels compared are exactly the instantiations the launchers ship. SASS comes from
``cuobjdump -sass`` (``$CUOBJDUMP``, on PATH, or the one triton ships).

``--family hopper``: the wgmma + TMA kernels, sm90a. The launchers are the ``.cu`` files of each tree that include
``tma_map.cuh`` or ``hopper_launch.cuh`` (``--units`` names others). Kernel names are demangled (``c++filt``) and
matched across trees by what they compute -- numerics, head_dim, block_n, P mode, Q smoothing
(:data:`HOPPER_TEMPLATES`); the schedule column shows each tree's (stages, ping-pong, pipe). Dynamic shared memory is
each tree's own constant (``Cfg::SMEM`` / ``SmemLayout::SMEM``), printed by a small host program. "PTX numeric ops in
the same order" compares the sequence of the instructions that decide the output's bits (:data:`NUMERIC_OPS`: float
arithmetic, conversions, ex2, wgmma, shuffles, dp4a). SASS is compared whenever cuobjdump is found; "SASS same" means
the instruction sequences are equal, operands included; otherwise it counts the new listing's instructions outside
the longest common opcode subsequence (moved or changed). Exits 1 when a kernel of the old tree is missing from the
new one, its registers, spills, stack or shared memory differ (spills that both trees have are shown, not failed) or
its numeric ops differ in kind or order; instruction-count deltas are printed (opcode: old -> new) for the reader to
explain. A kernel only the new tree has (the block-sparse instantiations, ``SPARSE = true``, keyed "... sparse"; those
that write the log-sum-exp, ``LSE = true`` or a combine with the numerics' LSE, keyed "... lse") is listed with its
own resources.

``--family mma``: the mma.sync kernels (``--archs``, default sm80/86/89/90a; ``--units``, default
:data:`MMA_UNITS`), compared unit by unit, with SASS only under ``--sass``. Kernels of old and new are paired by
:func:`mma_key` (numerics, head_dim, block_n, path, P mode and schedule), so a kernel without a partner means the
schedule changed (except a block-sparse instantiation, ``SPARSE = true``, keyed "... sparse": listed with its
resources, not failed; the dense one, ``SPARSE = false``, has the key of the kernel from before the flag). Per kernel:
the PTX and SASS opcode histograms and how many lines of their texts differ (registers, labels and mangled names
renumbered, so 0 means the same code; "(order)" after the count: the same lines, some in another order). Exits 1 when
any pair differs in resources or in an opcode histogram.

``--family pre``: the pre-processing kernels (``--units``, default :data:`PRE_UNITS`), compared as ``mma`` (the same
table and failures, default sm90a), paired by :func:`pre_key` (kernel, dtype and integer template arguments). A
kernel's ``V_HADAMARD`` flag (``col_stats_kernel`` / ``quantize_kernel`` of the int8-fp8 pre-processing: the online
V/O Hadamard's V side) keys its ``false`` instantiation as the kernel from before the flag and the ``true`` one with
"v_hadamard" (listed with its resources, not failed).

Compiling and reading the listings is :mod:`benchmarks.kernel_listing`; :data:`HOPPER_TEMPLATES` and :data:`MMA_KEYS`
are the only parts that know the kernels' names.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.kernel_listing import (
    REPO, KernelListing, KernelTree, compile_listing, demangle, export_kernels, find_cuobjdump, is_git_revision,
    kernel_tree, nvcc,
    nvcc_flags, opcode, opcode_histogram, run,
)

FAMILIES = ("hopper", "mma", "pre")
DEFAULT_ARCHS = {"hopper": "90a", "mma": "80,86,89,90a", "pre": "90a"}

# ---- hopper: the wgmma + TMA kernels -----------------------------------------------------------------------------

HOPPER_LAUNCHER_INCLUDES = re.compile(r'#include "(?:hopper/)?(tma_map|hopper_launch)\.cuh"')


@dataclass(frozen=True)
class HopperTemplate:
    """Kernels of one template, before or after the refactor: how to read their key and their shared memory."""

    pattern: re.Pattern  # on the demangled name
    key: str  # format of the match's groups: what the kernel computes
    schedule: str  # format of the match's groups: the kernel's (stages, ping-pong, pipe)
    headers: tuple[str, ...]  # headers that define the shared-memory constant
    smem: str | None  # C++ expression of the dynamic shared memory, formatted with the match's groups
    sparse_group: int | None = None  # the group of the SPARSE template flag ("true": key + " sparse"; absent or
    # "false": the dense kernel, the same key as a tree from before the flag)
    lse_group: int | None = None  # the group of the LSE template flag or the combine's LSE policy (key + " lse"
    # unless absent, "false" or NoLse: the kernel without the LSE, the same key as a tree from before the flag)

    def key_of(self, m: re.Match) -> str:
        key = self.key.format(*m.groups())
        if self.sparse_group is not None and m.group(self.sparse_group) == "true":
            key += " sparse"
        if self.lse_group is not None and m.group(self.lse_group) not in (None, "false", "rotvid::hopper::NoLse"):
            key += " lse"
        return key


_B = r"(true|false)"
HOPPER_TEMPLATES = (
    # aa5d692: int4_attention_wgmma_kernel<D, BN, PMODE, STAGES, PINGPONG, PIPE, SQ, FP8PV>
    HopperTemplate(re.compile(r"rotvid::wg::int4_attention_wgmma_kernel<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), "
                              + _B + r", (\d+)>"),
                   "int4 d{0} bn{1} pmode{2} sq={6}", "{3},{4},{5}", ("int4_attention_wgmma.cuh",),
                   "rotvid::wg::Cfg<{0}, {3}, {1}>::SMEM"),
    # aa5d692: int8fp8_attention_wgmma_kernel<D, BN, STAGES, PINGPONG, PIPE, NWG, MAGIC>
    HopperTemplate(re.compile(r"rotvid::wg8::int8fp8_attention_wgmma_kernel<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), "
                              r"(\d+)>"),
                   "int8fp8 d{0} bn{1}", "{2},{3},{4} magic={6}", ("int8fp8_attention_wgmma.cuh",),
                   "rotvid::wg8::Cfg<{0}, {2}, {1}, {5}>::SMEM"),
    # hopper_attention_kernel<Int4ValuedNumerics<D, BN, PMODE, SQ>, STAGES, PINGPONG, PIPE[, SPARSE[, LSE]]>
    HopperTemplate(re.compile(r"rotvid::hopper::hopper_attention_kernel<rotvid::hopper::Int4ValuedNumerics<(\d+), "
                              r"(\d+), (\d+), " + _B + r">, (\d+), (\d+), (\d+)(?:, " + _B + r")?(?:, " + _B
                              + r")?>"),
                   "int4 d{0} bn{1} pmode{2} sq={3}", "{4},{5},{6}", ("hopper_attention.cuh", "hopper_int4_numerics.cuh"),
                   "rotvid::hopper::SmemLayout<rotvid::hopper::Int4ValuedNumerics<{0}, {1}, {2}, {3}>, {4}>::SMEM",
                   8, 9),
    # hopper_attention_kernel<Int8Fp8Numerics<D, MAGIC>, STAGES, PINGPONG, PIPE[, SPARSE[, LSE]]>
    HopperTemplate(re.compile(r"rotvid::hopper::hopper_attention_kernel<rotvid::hopper::Int8Fp8Numerics<(\d+), " + _B
                              + r">, (\d+), (\d+), (\d+)(?:, " + _B + r")?(?:, " + _B + r")?>"),
                   "int8fp8 d{0} bn128", "{2},{3},{4} magic={1}", ("hopper_attention.cuh", "hopper_int8fp8_numerics.cuh"),
                   "rotvid::hopper::SmemLayout<rotvid::hopper::Int8Fp8Numerics<{0}, {1}>, {2}>::SMEM", 6, 7),
    # hopper_attention_kernel<Int8Fp8VoNumerics<D, MAGIC>, ...>: the same with the output un-rotated in the epilogue
    HopperTemplate(re.compile(r"rotvid::hopper::hopper_attention_kernel<rotvid::hopper::Int8Fp8VoNumerics<(\d+), "
                              + _B + r">, (\d+), (\d+), (\d+)(?:, " + _B + r")?(?:, " + _B + r")?>"),
                   "int8fp8-vo d{0} bn128", "{2},{3},{4} magic={1}",
                   ("hopper_attention.cuh", "hopper_int8fp8_numerics.cuh"),
                   "rotvid::hopper::SmemLayout<rotvid::hopper::Int8Fp8VoNumerics<{0}, {1}>, {2}>::SMEM", 6, 7),
    # combine_splits_kernel<D[, SPARSE[, L]]> (L: NoLse, or the numerics whose LSE it writes)
    HopperTemplate(re.compile(r"rotvid::(?:wg|hopper)::combine_splits_kernel<(\d+)(?:, " + _B + r")?(?:, "
                              r"(rotvid::hopper::\w+(?:<[^<>]*>)?))?\s*>"), "combine d{0}",
                   "", (), None, 2, 3),
)

# PTX instructions that decide the output's bits: float arithmetic, comparisons and conversions, ex2, the integer
# max (int8-fp8's row max) and row sums (dp4a), shuffles, the tensor-core products
NUMERIC_OPS = re.compile(r"^(fma|mul|add|sub|neg|abs|min|max|div|rcp|sqrt|selp|setp)\.(\w+\.)*f32|^(min|max)\.s32"
                         r"|^(ex2|cvt\.rn|wgmma\.mma_async|shfl|dp4a)")


@dataclass
class HopperKernel:
    name: str  # demangled
    key: str
    schedule: str
    resources: dict = field(default_factory=dict)  # registers, spill_stores, spill_loads, stack, barriers
    smem: int | None = None
    ptx: collections.Counter = field(default_factory=collections.Counter)
    numeric: list = field(default_factory=list)  # the PTX's NUMERIC_OPS in order
    sass: list = field(default_factory=list)  # instruction texts in order


def hopper_template(name: str) -> tuple[HopperTemplate, re.Match] | None:
    """The template a demangled kernel name instantiates, and the match of its arguments; None if unknown."""
    for tmpl in HOPPER_TEMPLATES:
        m = tmpl.pattern.search(name)
        if m:
            return tmpl, m
    return None


def hopper_tree(tree: KernelTree, units: list[str] | None, work: Path, cuobjdump: str | None
                ) -> dict[str, HopperKernel]:
    """Every kernel of the tree's Hopper launchers (``units``, or the sources including the launcher headers), keyed
    by what it computes."""
    if units is None:
        sources = sorted((f for f in tree.units.values() if HOPPER_LAUNCHER_INCLUDES.search(f.read_text())),
                         key=lambda f: f.name)
        if not sources:
            raise SystemExit(f"kernel_ptx_diff: no Hopper launcher (.cu including tma_map.cuh / hopper_launch.cuh) "
                             f"in {tree.root}")
    else:
        sources = [tree.unit(u) for u in units]
    listings: dict[str, KernelListing] = {}
    for src in sources:
        listings.update(compile_listing(src, "90a", work, cuobjdump, tree.include_dirs))
    kernels: dict[str, HopperKernel] = {}
    smem_exprs = {}
    for mangled, pretty in demangle(sorted(listings)).items():
        found = hopper_template(pretty)
        if found is None:
            print(f"  (not compared: {pretty})")
            continue
        tmpl, m = found
        lst = listings[mangled]
        ops = [opcode(i) for i in lst.ptx]
        k = HopperKernel(pretty, tmpl.key_of(m), tmpl.schedule.format(*m.groups()), lst.resources, None,
                         collections.Counter(ops), [op for op in ops if NUMERIC_OPS.match(op)], lst.sass or [])
        kernels[k.key] = k
        if tmpl.smem:
            smem_exprs[k.key] = (tmpl.headers, tmpl.smem.format(*m.groups()))
    if smem_exprs:  # each kernel's dynamic shared memory, as the tree's own constant
        headers = list(dict.fromkeys(h for hs, _ in smem_exprs.values() for h in hs))
        prog = work / "smem.cu"
        prog.write_text("#include <cstdio>\n" + "".join(f'#include "{tree.header(h)}"\n' for h in headers)
                        + "int main() {\n"
                        + "".join(f'  std::printf("%s\\t%d\\n", "{key}", (int)({expr}));\n'
                                  for key, (_, expr) in smem_exprs.items()) + "}\n")
        exe = work / "smem"
        run([nvcc(), *nvcc_flags("90a"), *(f"-I{d}" for d in tree.include_dirs), str(prog), "-o", str(exe)])
        for line in run([str(exe)]).stdout.splitlines():
            key, val = line.split("\t")
            kernels[key].smem = int(val)
    return kernels


def _count_delta(old: collections.Counter, new: collections.Counter) -> str:
    ops = sorted(set(old) | set(new))
    return ", ".join(f"{op}: {old[op]} -> {new[op]}" for op in ops if old[op] != new[op])


def hopper_report(old_tree: KernelTree, new_tree: KernelTree, units: list[str] | None, cuobjdump: str | None,
                  tmp: Path) -> int:
    """Build both trees, print the table and the opcode deltas; 1 when a kernel is missing or differs, else 0."""
    trees = {}
    for label, tree in (("old", old_tree), ("new", new_tree)):
        (tmp / label).mkdir()
        print(f"building the {label} tree's Hopper launchers ({tree.root}) ...", flush=True)
        trees[label] = hopper_tree(tree, units, tmp / label, cuobjdump)
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
        if cuobjdump is None:
            sass_same = "n/a (no cuobjdump)"
        elif o.sass == n.sass:
            sass_same = "yes"
        else:  # instructions of the new listing outside the longest matching opcode runs
            ops_o, ops_n = [opcode(i) for i in o.sass], [opcode(i) for i in n.sass]
            matched = sum(b.size for b in difflib.SequenceMatcher(None, ops_o, ops_n, autojunk=False).get_matching_blocks())
            sass_same = f"no: {len(ops_n) - matched} moved or changed"
        print(f"| {key} | {o.schedule} / {n.schedule} | {pair(ro.get('registers'), rn.get('registers'))} | "
              f"{pair((ro.get('spill_stores'), ro.get('spill_loads')), (rn.get('spill_stores'), rn.get('spill_loads')))} | "
              f"{pair(ro.get('stack'), rn.get('stack'))} | {pair(ro.get('barriers'), rn.get('barriers'))} | "
              f"{pair(o.smem, n.smem)} | {sum(o.ptx.values())} / {sum(n.ptx.values())} | "
              f"{'yes' if o.numeric == n.numeric else 'NO'} ({len(n.numeric)}) | "
              f"{len(o.sass)} / {len(n.sass)} | {sass_same} |")
        d_ptx = _count_delta(o.ptx, n.ptx)
        d_sass = _count_delta(opcode_histogram(o.sass), opcode_histogram(n.sass))
        if d_ptx or d_sass:
            details.append(f"- {key}: PTX {{{d_ptx or 'same'}}}; SASS {{{d_sass or 'same'}}}")
    print("\nOpcode deltas (old -> new):" if details else "\nPTX and SASS opcode histograms identical for every kernel.")
    print("\n".join(details))
    if bad:
        print("\nkernel_ptx_diff: a kernel is missing from one tree, or its resources differ or spill (see the table)")
    return 1 if bad else 0


# ---- mma: the mma.sync kernels ------------------------------------------------------------------------------------

MMA_UNITS = ("attn_s4_d64.cu", "attn_s4_d128.cu", "attn_s8_d64.cu", "attn_s8_d128.cu", "attn_int8fp8_mma.cu")
MMA_RESOURCES = ("registers", "spill_stores", "spill_loads", "stack", "smem")  # compared; a difference fails


def _walk_key(kind: str, n: int):
    """The key of ``mma_attention_kernel<..., SPARSE>`` whose first ``n`` integer arguments come before the SPARSE
    flag: the dense instantiation keyed as the kernel from before the flag, the block-sparse one with "sparse"."""

    def key(a: tuple) -> tuple:
        if len(a) > n:
            return (kind, *a[:n], "sparse") if a[n] else (kind, *a[:n])
        return (kind, *a)

    return key


# mangled kernel name -> comparable key: (pattern, key of the template's integer arguments in order)
MMA_KEYS = (
    # before the skeleton: int4_attention_kernel<D, BN, S4, PMODE, NW, MINB, STAGES, LEAN>
    (re.compile(r"int4_attention_kernel"), lambda a: ("int4", *a)),
    # int8fp8_attention_mma_kernel<D, NW, MINB> (2 stages, not lean)
    (re.compile(r"int8fp8_attention_mma_kernel"), lambda a: ("int8fp8", *a, 2, 0)),
    # mma_attention_kernel<Int4Numerics<D, BN, S4, PMODE>, NW, MINB, STAGES, LEAN[, SPARSE]>
    (re.compile(r"mma_attention_kernel.*Int4Numerics"), _walk_key("int4", 8)),
    # mma_attention_kernel<Int8Fp8Numerics<D>, NW, MINB, STAGES, LEAN[, SPARSE]>
    (re.compile(r"mma_attention_kernel.*Int8Fp8Numerics"), _walk_key("int8fp8", 5)),
    # mma_attention_kernel<Int8Fp8VoNumerics<D>, ...>: the same with the output un-rotated in the epilogue
    (re.compile(r"mma_attention_kernel.*Int8Fp8VoNumerics"), _walk_key("int8fp8-vo", 5)),
)


def mma_key(mangled: str) -> tuple | None:
    """The comparable key of a mangled kernel name (its integer template arguments in order), None if unknown."""
    args = tuple(int(v) for v in re.findall(r"L[ib](\d+)E", mangled))
    for pattern, key in MMA_KEYS:
        if pattern.search(mangled):
            return key(args)
    return None


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


# ---- pre: the pre-processing kernels (compared as the mma family) ----------------------------------------------------

PRE_UNITS = ("preprocess_int8fp8.cu", "preprocess_int4.cu", "rope_table.cu")
# kernel -> the number of its integer template arguments before a flag added later (its false instantiation is the
# kernel from before the flag), and the flag's name
PRE_FLAGS = {"col_stats_kernel": (1, "v_hadamard"), "quantize_kernel": (1, "v_hadamard")}
NEW_ONLY = ("sparse", "v_hadamard")  # key suffixes of instantiations only a new tree has (listed, not failed)


def pre_key(mangled: str) -> tuple | None:
    """The comparable key of a pre-processing kernel's mangled name: (kernel, dtype, integer template arguments),
    with a :data:`PRE_FLAGS` flag dropped when false and named when true; None for a name that is not a kernel."""
    m = re.match(r"_ZN6rotvid\d+\w+?\d+(\w+?_kernel)I", mangled)
    if m is None:
        return None
    dtype = "bf16" if "__nv_bfloat16" in mangled else "fp16" if "__half" in mangled else ""
    args = tuple(int(v) for v in re.findall(r"L[ib](\d+)E", mangled))
    kernel = m.group(1)
    n, flag = PRE_FLAGS.get(kernel, (len(args), ""))
    if len(args) > n:
        return (kernel, dtype, *args[:n], flag) if args[n] else (kernel, dtype, *args[:n])
    return (kernel, dtype, *args)


def mma_unit(tree: KernelTree, unit: str, arch: str, work: Path, cuobjdump: str | None, key_of=None
             ) -> dict[tuple, KernelListing]:
    """The mma.sync kernels of one launcher source for ``arch``, by :func:`mma_key` (``key_of``: another family's
    key function); SASS with its guard predicates taken off (as the PTX's)."""
    work.mkdir(exist_ok=True)
    out = {}
    for name, lst in compile_listing(tree.unit(unit), arch, work, cuobjdump, tree.include_dirs).items():
        key = (key_of or mma_key)(name)
        if key is None:
            continue
        sass = None if lst.sass is None else [re.sub(r"^@!?U?P\w+\s+", "", i) for i in lst.sass]
        out[key] = KernelListing(lst.resources, lst.ptx, sass)
    return out


def mma_compare(old: KernelListing, new: KernelListing) -> dict:
    """One row of the table: histogram deltas (opcode: new - old) and differing lines of the PTX and SASS texts."""
    row = {}
    for kind in ("ptx", "sass"):
        a, b = getattr(old, kind), getattr(new, kind)
        if a is None or b is None:
            continue
        h_old, h_new = opcode_histogram(a), opcode_histogram(b)
        row[kind] = {
            "n": (len(a), len(b)),
            "delta": {op: h_new[op] - h_old[op] for op in sorted(set(h_old) | set(h_new)) if h_new[op] != h_old[op]},
            "diff_lines": text_diff_lines(a, b),
        }
    return row


def _fmt_res(r: dict) -> str:
    return f"{r.get('registers', '?')}r/{r.get('spill_stores', '?')}s/{r.get('stack', '?')}st" if r else "-"


def mma_report(old_tree: KernelTree, new_tree: KernelTree, archs: list[str], units: list[str], cuobjdump: str | None,
               tmp: Path, key_of=None) -> int:
    """Compile every unit of both trees per arch and print one row per kernel; 1 when a pair differs, else 0
    (``key_of``: the pairing of another family, :func:`pre_key`)."""
    failed = False
    head = ["arch", "unit", "kernel", "regs/spill/stack old", "new"]
    for kind in ("PTX", "SASS") if cuobjdump else ("PTX",):
        head += [f"{kind} instr old/new", f"{kind} histogram (new - old)", f"{kind} lines differing"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for arch in archs:
        for unit in units:
            old = mma_unit(old_tree, unit, arch, tmp / "build-old", cuobjdump, key_of)
            new = mma_unit(new_tree, unit, arch, tmp / "build-new", cuobjdump, key_of)
            for key in sorted(set(old) | set(new), key=str):
                if key not in old and key[-1] in NEW_ONLY:  # a block-sparse or V-rotating kernel: nothing to compare
                    print(f"| sm_{arch} | {unit} | {key} | only in new | {_fmt_res(new[key].resources)} |")
                    continue
                if key not in old or key not in new:
                    failed = True
                    print(f"| sm_{arch} | {unit} | {key} | only in {'old' if key in old else 'new'} |")
                    continue
                ro, rn = old[key].resources, new[key].resources
                row = mma_compare(old[key], new[key])
                kinds = [row[k] for k in ("ptx", "sass") if k in row]
                failed |= any(ro.get(f) != rn.get(f) for f in MMA_RESOURCES) or any(r["delta"] for r in kinds)
                cells = []
                for r in kinds:
                    cells += [f"{r['n'][0]}/{r['n'][1]}", str(r["delta"] or "same"), r["diff_lines"]]
                print(f"| sm_{arch} | {unit} | {key} | {_fmt_res(ro)} | {_fmt_res(rn)} | " + " | ".join(cells) + " |")
    return 1 if failed else 0


# ---- command line ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=FAMILIES,
                    help="hopper: the wgmma + TMA kernels (sm90a); mma: the mma.sync kernels; pre: the pre-processing "
                         "kernels")
    ap.add_argument("--old", help="the old kernels: a saved tree (a repository root, a rotvid/kernels folder or a csrc "
                                  "folder), or a git revision of this repository")
    ap.add_argument("--old-rev", help="the old kernels: a git revision of this repository (its rotvid/kernels)")
    ap.add_argument("--new", type=Path, default=REPO,
                    help="the new kernels: a repository root, a rotvid/kernels folder or a csrc folder (default: this "
                         "tree)")
    ap.add_argument("--archs", default=None,
                    help="comma-separated compute capabilities (default: hopper 90a, the only one it builds for; "
                         f"mma {DEFAULT_ARCHS['mma']})")
    ap.add_argument("--units", default=None,
                    help="comma-separated launcher sources to compile (default: hopper, each tree's .cu files that "
                         f"include tma_map.cuh or hopper_launch.cuh; mma, {','.join(MMA_UNITS)}; pre, "
                         f"{','.join(PRE_UNITS)})")
    ap.add_argument("--sass", action="store_true",
                    help="compare SASS, and fail without cuobjdump (mma compares SASS only with it; hopper whenever "
                         "cuobjdump is found)")
    args = ap.parse_args(argv)
    if (args.old is None) == (args.old_rev is None):
        ap.error("give exactly one of --old, --old-rev")
    archs = (args.archs or DEFAULT_ARCHS[args.family]).split(",")
    if args.family == "hopper" and archs != ["90a"]:
        ap.error(f"--archs: the hopper family builds for sm90a only, got {args.archs!r}")
    default_units = {"hopper": None, "mma": list(MMA_UNITS), "pre": list(PRE_UNITS)}[args.family]
    units = args.units.split(",") if args.units else default_units
    cuobjdump = find_cuobjdump() if args.sass or args.family == "hopper" else None
    if args.sass and cuobjdump is None:
        ap.error("--sass needs cuobjdump ($CUOBJDUMP, on PATH, or triton's)")
    old_rev = args.old_rev
    if args.old is not None and not Path(args.old).is_dir():
        if not is_git_revision(args.old):
            ap.error(f"--old: expected a saved tree or a git revision of this repository, got {args.old!r}")
        old_rev = args.old
    new_tree = kernel_tree(args.new)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old_tree = kernel_tree(export_kernels(old_rev, tmp / "old-tree") if old_rev else Path(args.old))
        if args.family == "hopper":
            return hopper_report(old_tree, new_tree, units, cuobjdump, tmp)
        return mma_report(old_tree, new_tree, archs, units, cuobjdump, tmp,
                          pre_key if args.family == "pre" else None)


if __name__ == "__main__":
    sys.exit(main())
