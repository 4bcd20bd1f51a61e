"""The CUDA extension: the arch table, build and load.

The CUDA sources are found by folder (:mod:`rotvid.kernels.cuda_sources`: the shared skeletons in
``rotvid/kernels/csrc`` and each recipe's ``rotvid/kernels/recipes/<name>/csrc``) and compiled at first use with
``torch.utils.cpp_extension.load`` (ninja) into one extension in a cache directory (``$ROTVID_EXT_CACHE`` or
``~/.cache/rotvid/ext``), keyed by the sources, torch/CUDA versions and compute capability, and
reused afterwards. The compiler is found by :mod:`rotvid.kernels.cuda_toolkit` (``$ROTVID_NVCC``, then the pip
packages of ``pip install 'rotvid[cuda]'``, then ``$CUDA_HOME`` / ``nvcc`` on ``PATH`` / ``/usr/local/cuda``) and
checked against torch's CUDA and the driver before any compile; a pip-installed one needs no ``CUDA_HOME``: the build
is given its folders (``CUDA_HOME`` for cpp_extension, headers, ``libcudart``). A build logs that it is building and how long the
last one took; each build records its duration (``build.json`` in its folder, ``last_build.json`` in the cache), and
``rotvid build`` (:func:`build_extension`) runs it ahead of time. ``$ROTVID_EXT_CUDA_FLAGS`` adds nvcc flags (part of the cache key), a tuning aid: e.g.
``-DROTVID_HOPPER_STAGES=4 -DROTVID_HOPPER_PINGPONG=2 -DROTVID_HOPPER_PIPE=1`` builds the Hopper kernel with that
schedule in place of its table's (``csrc/hopper/hopper_schedule.cuh``; ``benchmarks/kernel_variants.py`` builds and
times one extension per setting), and ``-DROTVID_MMA_STAGES=3`` (``_NW``, ``_MINB``, ``_LEAN``) overrides the mma.sync
kernel's table (``csrc/mma/mma_schedule.cuh``). A release build reads no environment variable in its kernels.

The arch table (:data:`ARCH_TABLE`, compute capability -> the GPU's instruction facts and nvcc target) says *how* a
GPU builds and runs the kernels (:mod:`rotvid.kernels.recipes.int4.ops` describes the INT4 paths); it names no recipe:
which kernels of a recipe run on a GPU is the recipe's, from these facts (e.g.
:func:`rotvid.kernels.recipes.int8_fp8.ops.int8fp8_kernels`), and which recipe ``auto`` picks on it is the recipes'
table (:mod:`rotvid.kernels.recipes.auto`). Every source is compiled for every supported architecture, so the s4 path
can be tested on an H100 (where it runs emulated, slowly) by passing ``path="s4"``.
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

from rotvid.kernels import cuda_sources, cuda_toolkit

logger = logging.getLogger(__name__)

CSRC = cuda_sources.KERNELS / cuda_sources.SHARED  # the shared sources, and the include folder of every compile


@dataclass(frozen=True)
class ArchEntry:
    """One row of the arch table: the instruction path and the nvcc target of a compute capability."""

    path: str  # "s4" (native INT4 mma) or "s8" (INT4-valued numbers on INT8 mma)
    gencode: str
    wgmma: bool = False  # the Hopper kernel (wgmma + TMA) is built and is the default kernel
    fp8_mma: bool = False  # FP8 tensor cores: e4m3 mma.sync (sm89 and later)


# One cached table: compute capability -> instruction path and nvcc target.
ARCH_TABLE: dict[tuple[int, int], ArchEntry] = {
    (8, 0): ArchEntry("s4", "-gencode=arch=compute_80,code=sm_80"),
    (8, 6): ArchEntry("s4", "-gencode=arch=compute_86,code=sm_86"),
    (8, 7): ArchEntry("s4", "-gencode=arch=compute_87,code=sm_87"),
    (8, 9): ArchEntry("s4", "-gencode=arch=compute_89,code=sm_89", fp8_mma=True),
    (9, 0): ArchEntry("s8", "-gencode=arch=compute_90a,code=sm_90a", wgmma=True, fp8_mma=True),
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


def _source_hash(nvcc_version: str = "", sources: cuda_sources.CudaSources | None = None) -> str:
    """A hash of every source and header (their paths under ``rotvid/kernels`` and their bytes), torch's and the
    compiler's versions and the extra flags."""
    found = cuda_sources.find_sources() if sources is None else sources
    h = hashlib.sha256()
    for path in (*found.sources, *found.headers):
        h.update(path.relative_to(found.kernels).as_posix().encode())
        h.update(path.read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch.version.cuda).encode())
    h.update(" ".join(_extra_cuda_flags()).encode())
    h.update(nvcc_version.encode())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("ROTVID_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rotvid", "ext")
    return Path(root)


def extension_name(cap: tuple[int, int], toolkit: cuda_toolkit.Toolkit,
                   sources: cuda_sources.CudaSources | None = None) -> str:
    """The extension's name, also its cache folder: arch and a hash of sources (default: those found now), torch,
    flags and compiler. Every recipe's kernels are in the one extension."""
    return f"rotvid_cuda_sm{cap[0]}{cap[1]}_{_source_hash(toolkit.version, sources)}"


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


def compile_args(cap: tuple[int, int], sources: cuda_sources.CudaSources | None = None) -> dict:
    """What the build of ``cap``'s extension compiles and how, as ``torch.utils.cpp_extension.load`` arguments: every
    source found (:func:`rotvid.kernels.cuda_sources.find_sources`, or ``sources``), the flags with the arch table's
    nvcc target, and the include folders of the sources (the compiler's own are added by the build)."""
    found = cuda_sources.find_sources() if sources is None else sources
    return dict(
        sources=[str(p) for p in found.sources],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", ARCH_TABLE[cap].gencode, *_extra_cuda_flags()],
        extra_include_paths=[str(p) for p in found.include_dirs],
    )


def _build(cap: tuple[int, int], *, announce: bool = True):
    """Build (when needed) and load the extension for ``cap``: (module, name, folder, seconds or None when it was
    built already, toolkit)."""
    from torch.utils import cpp_extension

    toolkit = cuda_toolkit.find_toolkit(embeds_ptx=_embeds_ptx())  # the fit is checked before any compile
    found = cuda_sources.find_sources()
    name = extension_name(cap, toolkit, found)
    args = compile_args(cap, found)
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
            sources=args["sources"],
            extra_cflags=args["extra_cflags"],
            extra_cuda_cflags=args["extra_cuda_cflags"],
            extra_include_paths=[*args["extra_include_paths"], *(str(p) for p in toolkit.include_dirs)],
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
    total = len(cuda_sources.find_sources().sources)
    if on_progress is not None:
        start = time.time()

        def watch():
            while not stop.wait(0.5):
                done = sum(1 for p in plan.folder.glob("*.o") if p.stat().st_mtime >= start)
                on_progress(min(done, total), total)

        on_progress(0, total)
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
        on_progress(total, total)
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
