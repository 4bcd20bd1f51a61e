"""The CUDA extension: sources, the arch table, build and load.

The CUDA sources live in ``rotvid/kernels/csrc`` and are compiled at first use with
``torch.utils.cpp_extension.load`` (ninja) into a cache directory (``$ROTVID_EXT_CACHE`` or
``~/.cache/rotvid/ext``), keyed by the sources, torch/CUDA versions and compute capability, and
reused afterwards. ``$ROTVID_EXT_CUDA_FLAGS`` adds nvcc flags (part of the cache key), a tuning aid: e.g.
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

import functools
import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

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
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        raise RuntimeError("rotvid CUDA kernels: nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return nvcc


def _extra_cuda_flags() -> list[str]:
    """Extra nvcc flags from ``$ROTVID_EXT_CUDA_FLAGS`` (a tuning aid, e.g. ``-DROTVID_HOPPER_STAGES=4``)."""
    return os.environ.get("ROTVID_EXT_CUDA_FLAGS", "").split()


def _source_hash() -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch.version.cuda).encode())
    h.update(" ".join(_extra_cuda_flags()).encode())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("ROTVID_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rotvid", "ext")
    return Path(root)


@functools.cache
def _load_for(cap: tuple[int, int]):
    from torch.utils import cpp_extension

    entry = ARCH_TABLE[cap]
    _nvcc()
    name = f"rotvid_cuda_sm{cap[0]}{cap[1]}_{_source_hash()}"  # every recipe's kernels, one extension
    build = cache_dir() / name
    build.mkdir(parents=True, exist_ok=True)
    logger.info("loading/building rotvid CUDA extension %s in %s", name, build)
    return cpp_extension.load(
        name=name,
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", entry.gencode, *_extra_cuda_flags()],
        build_directory=str(build),
        verbose=os.environ.get("ROTVID_EXT_VERBOSE") == "1",
    )


def load_extension(device: torch.device | None = None):
    """Build (first use) or load the extension for ``device``'s compute capability."""
    arch_entry(device)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    return _load_for(capability(device))


@torch.compiler.assume_constant_result
def device_problem(device_index: int) -> str:
    """Why the CUDA kernels cannot run on GPU ``device_index`` ("" when they can): compute capability in the arch
    table and nvcc found. Host facts that do not change during a run: under torch.compile this runs once while
    tracing and its result is a constant of the graph (no file-system probe, no device query in the graph)."""
    try:
        arch_entry(torch.device("cuda", device_index))
        _nvcc()
    except RuntimeError as err:
        return str(err)
    return ""
