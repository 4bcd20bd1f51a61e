"""A CUDA source's kernels as the compiler lists them, without a GPU: per kernel (by mangled name) its ptxas
resources, its PTX instructions and, with ``cuobjdump``, its SASS instructions; and a tree's CUDA sources
(:class:`KernelTree`: this repository's layout and the flat ``csrc`` folder of before the recipe folders).

Nothing here knows a kernel's name or template: ``kernel_ptx_diff.py`` pairs the kernels of two trees by what they
compute and compares them.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KERNELS = "rotvid/kernels"
CSRC = "rotvid/kernels/csrc"


@dataclass(frozen=True)
class KernelTree:
    """The CUDA sources of one tree: its ``.cu`` files and headers by file name (unique in a tree), and the include
    folders its sources compile with.

    Found by the rule of ``rotvid/kernels/cuda_sources.py``: the shared ``csrc/`` (also the one include folder) and
    each recipe's ``recipes/<name>/csrc/`` of a kernels folder. A tree from before the recipe folders is its flat
    ``csrc/``, which the same rule reads (no recipe folder holds sources there)."""

    root: Path  # what was given: a repository root, a kernels folder or a csrc folder
    units: dict[str, Path]
    headers: dict[str, Path]
    include_dirs: tuple[Path, ...]

    def unit(self, name: str) -> Path:
        """The source named ``name`` (e.g. ``attn_s8_d64.cu``); SystemExit naming the tree when it has none."""
        if name not in self.units:
            raise SystemExit(f"kernel_ptx_diff: no source {name!r} in {self.root}")
        return self.units[name]

    def header(self, name: str) -> Path:
        if name not in self.headers:
            raise SystemExit(f"kernel_ptx_diff: no header {name!r} in {self.root}")
        return self.headers[name]


def kernel_tree(path: Path) -> KernelTree:
    """The CUDA sources under ``path``: a repository root (its ``rotvid/kernels``), a kernels folder (with ``csrc/``
    and ``recipes/``) or a csrc folder on its own (a saved flat ``csrc`` of an old tree)."""
    path = Path(path).resolve()
    if (path / CSRC).is_dir():
        kernels = path / KERNELS
    elif (path / "csrc").is_dir():
        kernels = path
    elif path.is_dir():
        return _tree(path, [path], path)
    else:
        raise SystemExit(f"kernel_ptx_diff: expected a repository root, a kernels folder or a csrc folder, got {path}")
    folders = [kernels / "csrc", *sorted(p for p in (kernels / "recipes").glob("*/csrc") if p.is_dir())]
    return _tree(path, folders, kernels / "csrc")


def _tree(root: Path, folders: list[Path], include: Path) -> KernelTree:
    files = sorted(f for d in folders for f in d.rglob("*") if f.is_file())
    units = {f.name: f for f in files if f.suffix == ".cu"}
    headers = {f.name: f for f in files if f.suffix in (".cuh", ".h")}
    return KernelTree(root, units, headers, (include,))


@dataclass
class KernelListing:
    """One kernel of a compiled source."""

    resources: dict  # registers, spill_stores, spill_loads, stack, smem (static, bytes), barriers (when ptxas says)
    ptx: list[str]  # instruction texts in order, guard predicate dropped
    sass: list[str] | None  # instruction texts in order, guard predicate kept; None without cuobjdump or listing


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """``cmd``'s completed process (text output); stops the program with the command and its stderr if it fails."""
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise SystemExit(f"kernel_ptx_diff: command failed: {' '.join(cmd)}\n{res.stderr}")
    return res


def nvcc() -> str:
    """``$NVCC``, else the ``nvcc`` on PATH."""
    return os.environ.get("NVCC") or shutil.which("nvcc") or "nvcc"


def nvcc_flags(arch: str) -> list[str]:
    """The flags the extension and ``.ci/compile_cuda`` build with, for compute capability ``arch`` (80, 89, 90a)."""
    return ["-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def find_cuobjdump() -> str | None:
    """``$CUOBJDUMP``, else the ``cuobjdump`` on PATH, else the one triton ships; None when there is none."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin is not None:
        cand = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    return None


def is_git_revision(rev: str) -> bool:
    """Whether ``rev`` names a commit of this repository."""
    res = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=REPO,
                         capture_output=True, text=True)
    return res.returncode == 0


def export_kernels(rev: str, dest: Path) -> Path:
    """``rotvid/kernels`` of git revision ``rev`` under ``dest`` (``git archive``: the shared ``csrc`` and the recipes'
    folders, or the flat ``csrc`` of an old revision); returns the kernels folder (:func:`kernel_tree` reads it)."""
    data = subprocess.run(["git", "archive", rev, KERNELS], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest / KERNELS


def ptxas_resources(log: str) -> dict[str, dict[str, int]]:
    """Per kernel of a ``-Xptxas -v`` log: registers, spill_stores / spill_loads and stack (bytes), smem (static
    shared memory, bytes; 0 when not given) and barriers (when given)."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line) or re.search(r"Function properties for (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(m.group(1)) if m else 0
        m = re.search(r"used (\d+) barriers", line)
        if m:
            cur["barriers"] = int(m.group(1))
    return out


def ptx_instructions(body: str) -> list[str]:
    """The instructions of a PTX function body in order: directives, braces, labels and comments dropped, and a guard
    predicate (``@%p1``, ``@!%p2``) taken off."""
    lines = []
    for raw in body.splitlines():
        line = raw.split("//")[0].strip()
        if not line or line[0] in ".{}()" or line.endswith(":"):
            continue
        lines.append(re.sub(r"^@\S+\s+", "", line))
    return lines


def ptx_entries(ptx: str) -> dict[str, list[str]]:
    """The instructions of every ``.entry`` of a PTX file, by mangled name: its body from the opening brace to the
    brace that closes it (inline asm blocks open and close their own, at any indent)."""
    out = {}
    for m in re.finditer(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(", ptx, re.M):
        body, depth = [], 0
        for line in ptx[ptx.index("{", m.end()):].splitlines():
            code = line.split("//")[0]
            depth += code.count("{") - code.count("}")
            body.append(line)
            if depth == 0:
                break
        out[m.group(1)] = ptx_instructions("\n".join(body))
    return out


def sass_entries(dump: str) -> dict[str, list[str]]:
    """Per function of a ``cuobjdump -sass`` listing, its instruction texts in order (address and encoding dropped,
    white space folded, a guard predicate kept)."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in dump.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;\s*/\*", line)
        if m and cur is not None:
            cur.append(re.sub(r"\s+", " ", m.group(1)))
    return out


def opcode(instr: str) -> str:
    """An instruction's opcode with its modifiers (``ld.shared.v2.f32``, ``IMAD.WIDE``), a guard predicate skipped."""
    tok = instr.split()
    if tok and tok[0].startswith("@"):
        tok = tok[1:]
    return tok[0].rstrip(";") if tok else ""


def opcode_histogram(instructions: list[str]) -> collections.Counter:
    """Opcode -> count."""
    return collections.Counter(opcode(i) for i in instructions if i)


def compile_listing(src: Path, arch: str, work: Path, cuobjdump: str | None,
                    include: tuple[Path, ...] = ()) -> dict[str, KernelListing]:
    """Compile ``src`` for ``arch`` as the extension does, once to PTX and once to an object with ``-Xptxas -v``
    (files under ``work``); every kernel by mangled name, with its SASS when ``cuobjdump`` is given. ``include``: the
    ``-I`` folders (a tree's :attr:`KernelTree.include_dirs`)."""
    base = [nvcc(), *nvcc_flags(arch), *(f"-I{d}" for d in include), str(src)]
    tag = work / f"{src.name}.{arch}"
    run([*base, "-ptx", "-o", f"{tag}.ptx"])
    obj = run([*base, "-Xptxas", "-v", "-c", "-o", f"{tag}.o"])
    resources = ptxas_resources(obj.stdout + obj.stderr)
    ptx = ptx_entries(Path(f"{tag}.ptx").read_text())
    sass = sass_entries(run([cuobjdump, "-sass", f"{tag}.o"]).stdout) if cuobjdump else {}
    return {name: KernelListing(resources.get(name, {}), ptx.get(name, []), sass.get(name))
            for name in sorted(set(resources) | set(ptx))}


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> demangled kernel names (``c++filt``)."""
    if not names:
        return {}
    filt = shutil.which("c++filt")
    if filt is None:
        raise SystemExit("kernel_ptx_diff: c++filt not found (binutils): kernel names cannot be demangled")
    out = run([filt], input="\n".join(names) + "\n").stdout.splitlines()
    return dict(zip(names, out))
