"""The CUDA extension: sources, the arch table, build and load.

The CUDA sources live in ``rotvid/kernels/csrc`` and are compiled at first use with
``torch.utils.cpp_extension.load`` (ninja) into a cache directory (``$ROTVID_EXT_CACHE`` or
``~/.cache/rotvid/ext``), keyed by the sources, torch/CUDA versions and compute capability, and
reused afterwards. The compiler is found by :mod:`rotvid.kernels.cuda_toolkit` (``$ROTVID_NVCC``, then the pip
packages of ``pip install 'rotvid[cuda]'``, then ``$CUDA_HOME`` / ``nvcc`` on ``PATH`` / ``/usr/local/cuda``) and
checked against torch's CUDA and the driver before any compile; a pip-installed one needs no ``CUDA_HOME``: the build
is given its folders (``CUDA_HOME`` for cpp_extension, headers, ``libcudart``). A build logs that it is building and how long the
last one took; each build records its duration (``build.json`` in its folder, ``last_build.json`` in the cache), and
``rotvid build`` (:func:`build_extension`) runs it ahead of time. ``$ROTVID_EXT_CUDA_FLAGS`` adds nvcc flags (part of the cache key), a tuning aid: e.g.
``-DROTVID_HOPPER_STAGES=4 -DROTVID_HOPPER_PINGPONG=2 -DROTVID_HOPPER_PIPE=1`` builds the Hopper kernel with that
schedule in place of its table's (``csrc/hopper_schedule.cuh``; ``benchmarks/kernel_variants.py`` builds and times one
extension per setting), and ``-DROTVID_MMA_STAGES=3`` (``_NW``, ``_MINB``, ``_LEAN``) overrides the mma.sync kernel's
table (``csrc/mma_schedule.cuh``). A release build reads no environment variable in its kernels.

The arch table (:data:`ARCH_TABLE`, compute capability -> instruction path and nvcc target) says *how* a GPU runs
the kernels (:mod:`rotvid.kernels.cuda_layout` describes the paths); which recipe ``auto`` picks on it is the
recipes' table (:mod:`rotvid.kernels.recipes.auto`). Every path is compiled for every supported architecture, so
the s4 path can be tested on an H100 (where it runs emulated, slowly) by passing ``path="s4"``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from rotvid.kernels import cuda_toolkit

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = (
    "binding.cpp",
    "preprocess_int4.cu",
    "preprocess_int8fp8.cu",
    "attn_dispatch.cu",
    "attn_s8_d64.cu",
    "attn_s8_d128.cu",
    "attn_s4_d64.cu",
    "attn_s4_d128.cu",
    "attn_hopper.cu",
    "attn_hopper_int4.cu",
    "attn_hopper_int8fp8.cu",
    "attn_int8fp8_mma.cu",
    "rope_table.cu",
    "hadamard_rows.cu",
)
HEADERS = (
    "int4_common.cuh",
    "int4_rowmath.cuh",
    "rope_rows.cuh",
    "key_blocks.cuh",
    "sm90_ops.cuh",
    "hopper_attention.cuh",
    "hopper_int4_numerics.cuh",
    "hopper_int8fp8_numerics.cuh",
    "hopper_schedule.cuh",
    "hopper_launch.cuh",
    "mma_attention.cuh",
    "mma_numerics_int4.cuh",
    "mma_numerics_int8fp8.cuh",
    "mma_schedule.cuh",
    "tma_map.cuh",
)


@dataclass(frozen=True)
class ArchEntry:
    """One row of the arch table: the instruction path and the nvcc target of a compute capability."""

    path: str  # "s4" (native INT4 mma) or "s8" (INT4-valued numbers on INT8 mma)
    gencode: str
    wgmma: bool = False  # the Hopper kernel (wgmma + TMA) is built and is the default kernel
    int8fp8: tuple[str, ...] = ()  # the int8-fp8 kernels that run here, the default first (empty: none)


# One cached table: compute capability -> instruction path and nvcc target.
ARCH_TABLE: dict[tuple[int, int], ArchEntry] = {
    (8, 0): ArchEntry("s4", "-gencode=arch=compute_80,code=sm_80"),
    (8, 6): ArchEntry("s4", "-gencode=arch=compute_86,code=sm_86"),
    (8, 7): ArchEntry("s4", "-gencode=arch=compute_87,code=sm_87"),
    (8, 9): ArchEntry("s4", "-gencode=arch=compute_89,code=sm_89", int8fp8=("mma",)),
    (9, 0): ArchEntry("s8", "-gencode=arch=compute_90a,code=sm_90a", wgmma=True, int8fp8=("wgmma", "mma")),
}

def capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def arch_entry(device: torch.device | None = None) -> ArchEntry:
    """The arch-table row of ``device`` (default: the current CUDA device); RuntimeError naming what is missing."""
    if not torch.cuda.is_available():
        raise RuntimeError("rotvid CUDA kernels: no CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    cap = capability(device)
    if cap not in ARCH_TABLE:
        known = ", ".join(f"sm{a}{b}" for a, b in ARCH_TABLE)
        raise RuntimeError(f"rotvid CUDA kernels: unsupported compute capability sm{cap[0]}{cap[1]} (supported: {known})")
    return ARCH_TABLE[cap]


def _nvcc() -> str:
    """The nvcc the extension builds with; RuntimeError naming what is missing or does not fit (before any
    compile)."""
    return str(cuda_toolkit.find_toolkit(embeds_ptx=_embeds_ptx()).nvcc)


def _embeds_ptx() -> bool:
    """Whether the build embeds PTX (the arch table's targets are SASS only; ``$ROTVID_EXT_CUDA_FLAGS`` may add
    ``code=compute_XX``)."""
    return any(re.search(r"code=\[?[^ ]*compute_", f) for f in _extra_cuda_flags())


def _extra_cuda_flags() -> list[str]:
    """Extra nvcc flags from ``$ROTVID_EXT_CUDA_FLAGS`` (a tuning aid, e.g. ``-DROTVID_HOPPER_STAGES=4``)."""
    return os.environ.get("ROTVID_EXT_CUDA_FLAGS", "").split()


def _source_hash(nvcc_version: str = "") -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch.version.cuda).encode())
    h.update(" ".join(_extra_cuda_flags()).encode())
    h.update(nvcc_version.encode())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("ROTVID_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rotvid", "ext")
    return Path(root)


def extension_name(cap: tuple[int, int], toolkit: cuda_toolkit.Toolkit) -> str:
    """The extension's name, also its cache folder: arch and a hash of sources, torch, flags and compiler."""
    return f"rotvid_cuda_sm{cap[0]}{cap[1]}_{_source_hash(toolkit.version)}"  # every recipe's kernels, one extension


LAST_BUILD = "last_build.json"


def last_build() -> dict | None:
    """The record of the last build into this cache (seconds, arch, compiler, folder), or None."""
    try:
        return json.loads((cache_dir() / LAST_BUILD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _record_build(build: Path, name: str, cap: tuple[int, int], seconds: float, toolkit) -> dict:
    record = {"extension": name, "arch": f"sm{cap[0]}{cap[1]}", "seconds": round(seconds, 1),
              "jobs": os.environ.get("MAX_JOBS") or os.cpu_count(), "nvcc": str(toolkit.nvcc),
              "nvcc_version": toolkit.version, "nvcc_source": toolkit.source, "folder": str(build),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    text = json.dumps(record, indent=1) + "\n"
    (build / "build.json").write_text(text, encoding="utf-8")
    (cache_dir() / LAST_BUILD).write_text(text, encoding="utf-8")
    return record


def building_message(name: str, build: Path, toolkit) -> str:
    """What a call that builds the extension says first: where, with which compiler, and how long the last took."""
    last = last_build()
    took = (f"the last build took {last['seconds']:.0f} s ({last.get('jobs')} jobs)" if last and "seconds" in last
            else "a first build takes about a minute with 16 cores, far longer with few")
    return (f"building the rotvid CUDA kernels {name} into {build} with {toolkit.describe()}: {took} "
            "(`rotvid build` does this ahead of time)")


@contextlib.contextmanager
def _toolkit_for_build(toolkit):
    """cpp_extension reads the toolkit from its module-level CUDA_HOME (set when it was imported): point it at the
    compiler found for the build, and put it back after."""
    from torch.utils import cpp_extension

    saved = cpp_extension.CUDA_HOME
    cpp_extension.CUDA_HOME = str(toolkit.home)
    try:
        yield
    finally:
        cpp_extension.CUDA_HOME = saved


def _link_dirs(toolkit) -> list[str]:
    """-L folders so that cpp_extension's ``-lcudart`` resolves: a pip-installed cudart is ``libcudart.so.13`` only
    (no unversioned link), so a folder in the cache gets one."""
    cudart = toolkit.cudart
    if cudart is None or cudart.name == "libcudart.so":
        return [f"-L{cudart.parent}"] if cudart is not None else []
    shim = cache_dir() / f"cudart-{cudart.name}-{hashlib.sha256(str(cudart).encode()).hexdigest()[:8]}"
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "libcudart.so"
    if not link.is_symlink() or os.readlink(link) != str(cudart):
        link.unlink(missing_ok=True)
        link.symlink_to(cudart)
    return [f"-L{shim}"]


def _library_path(build: Path, name: str) -> Path:
    return build / f"{name}.so"


def _build(cap: tuple[int, int], *, announce: bool = True):
    """Build (when needed) and load the extension for ``cap``: (module, name, folder, seconds or None when it was
    built already, toolkit)."""
    from torch.utils import cpp_extension

    entry = ARCH_TABLE[cap]
    toolkit = cuda_toolkit.find_toolkit(embeds_ptx=_embeds_ptx())  # the fit is checked before any compile
    name = extension_name(cap, toolkit)
    build = cache_dir() / name
    build.mkdir(parents=True, exist_ok=True)
    fresh = not _library_path(build, name).exists()
    if fresh and announce:
        logger.warning("%s", building_message(name, build, toolkit))
    else:
        logger.info("loading rotvid CUDA extension %s from %s", name, build)
    start = time.perf_counter()
    with _toolkit_for_build(toolkit):
        module = cpp_extension.load(
            name=name,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", entry.gencode, *_extra_cuda_flags()],
            extra_include_paths=[str(p) for p in toolkit.include_dirs],
            extra_ldflags=_link_dirs(toolkit),
            build_directory=str(build),
            verbose=os.environ.get("ROTVID_EXT_VERBOSE") == "1",
        )
    seconds = time.perf_counter() - start
    if fresh:
        _record_build(build, name, cap, seconds, toolkit)
        logger.warning("built rotvid CUDA extension %s in %.0f s", name, seconds)
    return module, name, build, seconds if fresh else None, toolkit


@functools.cache
def _load_for(cap: tuple[int, int]):
    return _build(cap)[0]


@dataclass(frozen=True)
class BuildPlan:
    """What ``rotvid build`` is about to build: the arch, the compiler (checked), the extension and its folder."""

    cap: tuple[int, int]
    toolkit: cuda_toolkit.Toolkit
    name: str
    folder: Path

    @property
    def arch(self) -> str:
        return f"sm{self.cap[0]}{self.cap[1]}"

    @property
    def built(self) -> bool:
        return _library_path(self.folder, self.name).exists()


def parse_arch(text: str) -> tuple[int, int]:
    """``sm_90a``, ``sm90``, ``9.0`` -> ``(9, 0)``; ValueError for a name not in the arch table."""
    known = ", ".join(f"sm{a}{b}" for a, b in ARCH_TABLE)
    m = re.fullmatch(r"(?:sm_?)?(\d)\.?(\d)a?", text.strip().lower())
    if m is None or (int(m.group(1)), int(m.group(2))) not in ARCH_TABLE:
        raise ValueError(f"--arch: expected one of {known} (e.g. sm90a), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def plan_build(cap: tuple[int, int] | None = None) -> BuildPlan:
    """The build ``rotvid build`` runs for ``cap`` (default: this machine's GPU). RuntimeError, before any compile,
    for no GPU (and no ``cap``), a CPU build of torch, an arch outside the table, no compiler or one that does not fit
    torch or the driver."""
    if cap is None:
        if not torch.cuda.is_available():
            raise RuntimeError("rotvid build: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
                               "build on the GPU machine, or name the target with --arch (e.g. --arch sm90a)")
        arch_entry()
        cap = capability(torch.device("cuda", torch.cuda.current_device()))
    elif torch.version.cuda is None:
        raise RuntimeError(f"rotvid build: torch {torch.__version__} is a CPU build (torch.version.cuda is None); "
                           "the CUDA kernels build against torch's CUDA build")
    toolkit = cuda_toolkit.find_toolkit(embeds_ptx=_embeds_ptx())
    name = extension_name(cap, toolkit)
    return BuildPlan(cap=cap, toolkit=toolkit, name=name, folder=cache_dir() / name)


def build_extension(plan: BuildPlan, on_progress: Callable[[int, int], None] | None = None) -> float | None:
    """Compile (when not built yet) and load the extension of ``plan`` (``rotvid build``); the build's seconds, or
    None when it was built already. ``on_progress(done, total)`` is called as the object files appear."""
    stop = threading.Event()
    watcher = None
    if on_progress is not None:
        start = time.time()

        def watch():
            while not stop.wait(0.5):
                done = sum(1 for p in plan.folder.glob("*.o") if p.stat().st_mtime >= start)
                on_progress(min(done, len(SOURCES)), len(SOURCES))

        on_progress(0, len(SOURCES))
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    try:
        _, name, _, seconds, _ = _build(plan.cap, announce=False)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    if name != plan.name:  # the sources changed while planning
        raise RuntimeError(f"rotvid build: built {name}, planned {plan.name} (the sources changed meanwhile)")
    if on_progress is not None:
        on_progress(len(SOURCES), len(SOURCES))
    return seconds


def load_extension(device: torch.device | None = None):
    """Build (first use) or load the extension for ``device``'s compute capability."""
    arch_entry(device)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    return _load_for(capability(device))


@torch.compiler.assume_constant_result
def device_problem(device_index: int) -> str:
    """Why the CUDA kernels cannot run on GPU ``device_index`` ("" when they can): compute capability in the arch
    table and a CUDA compiler that fits torch and the driver found. Host facts that do not change during a run: under
    torch.compile this runs once while tracing and its result is a constant of the graph (no file-system probe, no
    device query in the graph)."""
    try:
        arch_entry(torch.device("cuda", device_index))
        _nvcc()
    except RuntimeError as err:
        return str(err)
    return ""
