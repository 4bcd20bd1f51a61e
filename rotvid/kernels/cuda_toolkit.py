"""The CUDA compiler the extension builds with: where it is found, its version, and whether it fits torch and the
driver.

Search order (the first compiler that fits wins; when none fits, one error names each one found with its version and
torch's or the driver's):

1. ``$ROTVID_NVCC``: the path of an ``nvcc`` (or of a toolkit folder holding ``bin/nvcc``), and only that one. Two
   words stand for a path: ``pip`` (only the pip packages, step 2) and ``system`` (only step 3).
2. The pip packages: ``nvidia/<name>/bin/nvcc`` under any folder on ``sys.path``. ``pip install 'rotvid[cuda]'``
   installs them: ``cuda-toolkit[nvcc,cccl]``, i.e. ``nvidia-cuda-nvcc`` (nvcc, ptxas, fatbinary, nvlink, cudafe++),
   ``nvidia-nvvm`` (cicc, libdevice), ``nvidia-cuda-crt`` (the crt headers), ``nvidia-cuda-runtime`` (cudart and its
   headers; torch's CUDA wheels bring the same one) and ``nvidia-cuda-cccl`` (``nv/target``, cub, thrust), all into
   ``site-packages/nvidia/cu13/`` laid out like a toolkit folder: ``bin/nvcc``, ``include/``, ``lib/``,
   ``nvvm/bin/cicc``, ``nvvm/libdevice/``. PyPI's CUDA 12 wheel (``nvidia-cuda-nvcc-cu12``, 12.8 and 12.9) holds
   ptxas and libnvvm but no ``nvcc``: a torch built for CUDA 12 needs a system toolkit.
3. The system toolkit: ``$CUDA_HOME`` (or ``$CUDA_PATH``), ``nvcc`` on ``PATH``, ``/usr/local/cuda``.

A compiler fits when its CUDA major version is torch's (``torch.version.cuda``; cpp_extension refuses another
major) and its major.minor is not older than torch's, and when the driver (``torch._C._cuda_getDriverVersion``)
runs what it makes: the extension embeds SASS only (``code=sm_XX``), which CUDA's minor-version compatibility runs
on any driver of the same major, so the driver's major must not be older than the compiler's; flags that embed PTX
(``code=compute_XX`` in ``$ROTVID_EXT_CUDA_FLAGS``) need a driver of at least the compiler's major.minor.

How the match with torch is kept: the ``cuda`` extra names ``cuda-toolkit[nvcc,cccl]`` with no exact version
(``>=13,<14``). torch's PyPI wheels pin ``cuda-toolkit`` themselves (torch 2.13: ``cuda-toolkit==13.0.3``, CUDA
13.0), so the resolver installs the compiler of torch's own CUDA release; a newer torch pins a newer
``cuda-toolkit`` and the extra follows it. Where it does not (a torch from another index, a compiler installed by
hand), the check above stops the build with both versions named.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

ENV = "ROTVID_NVCC"
SYSTEM_ROOT = Path("/usr/local/cuda")
SOURCES = {  # where a compiler came from, as `rotvid backends` says it
    "ROTVID_NVCC": "$ROTVID_NVCC",
    "pip": "pip package",
    "CUDA_HOME": "$CUDA_HOME",
    "CUDA_PATH": "$CUDA_PATH",
    "PATH": "nvcc on PATH",
    "default": "the system toolkit",
}
INSTALL_HINT = "pip install 'rotvid[cuda]' brings the CUDA 13 compiler, or set ROTVID_NVCC to an nvcc"


@dataclass(frozen=True)
class Toolkit:
    """A CUDA compiler and the folders a build with it needs."""

    nvcc: Path  # the file found (may be a wrapper script)
    version: str  # nvcc's own, e.g. "13.0.88"
    source: str  # a key of SOURCES
    home: Path  # the CUDA_HOME equivalent: the folder above nvcc's real bin/ (nvcc.profile's TOP)
    include_dirs: tuple[Path, ...] = field(default=())  # headers outside home/include (another pip folder)
    cudart: Path | None = None  # libcudart.so[.N] the extension links

    @property
    def release(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    def describe(self) -> str:
        return f"nvcc {self.version} at {self.nvcc} ({SOURCES[self.source]})"


def _release_text(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]}"


def parse_cuda_version(text: str | None) -> tuple[int, int] | None:
    """``"13.0"`` -> ``(13, 0)``; None for None."""
    if text is None:
        return None
    m = re.match(r"(\d+)\.(\d+)", str(text))
    if m is None:
        raise ValueError(f"not a CUDA version: {text!r}")
    return int(m.group(1)), int(m.group(2))


def torch_cuda_version() -> tuple[int, int] | None:
    """The CUDA release torch was built with (None for a CPU build)."""
    return parse_cuda_version(torch.version.cuda)


def driver_cuda_version() -> tuple[int, int] | None:
    """The CUDA release the installed driver supports (None without a GPU)."""
    if not torch.cuda.is_available():
        return None
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is None:
        return None
    value = int(get())  # e.g. 13000 for CUDA 13.0
    return value // 1000, (value % 1000) // 10


@functools.cache
def _probe(nvcc: str, mtime_ns: int) -> tuple[str, str | None]:
    """(version, the real bin folder or None) of ``nvcc``: ``nvcc --version`` and nvcc.profile's ``_HERE_`` from a
    dry run (a wrapper script on PATH does not sit in its toolkit)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"{nvcc}: does not run ({err})") from None
    m = re.search(r"release (\d+)\.(\d+)(?:, V(\d+\.\d+(?:\.\d+)?))?", out.stdout)
    if out.returncode != 0 or m is None:
        said = " ".join((out.stdout + out.stderr).split())[:200]
        raise RuntimeError(f"{nvcc}: `nvcc --version` printed no CUDA release (exit {out.returncode}: {said!r})")
    version = m.group(3) or f"{m.group(1)}.{m.group(2)}"
    here = None
    try:
        dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
        found = re.search(r"^#\$ _HERE_=(.+)$", dry.stdout + dry.stderr, re.M)
        here = found.group(1).strip() if found else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return version, here


def probe_nvcc(nvcc: Path) -> tuple[str, Path]:
    """(version, home) of ``nvcc``; RuntimeError when it does not run or prints no release."""
    version, here = _probe(str(nvcc), nvcc.stat().st_mtime_ns)
    bin_dir = Path(here) if here and Path(here).is_dir() else Path(os.path.realpath(nvcc)).parent
    return version, bin_dir.parent


def _site_roots() -> list[Path]:
    """The folders pip installs into that this interpreter sees (``sys.path``)."""
    return [Path(p) for p in sys.path if p and os.path.isdir(p)]


def pip_candidates() -> list[Path]:
    """``nvidia/<name>/bin/nvcc`` under each folder of ``sys.path`` (CUDA 13's ``nvidia/cu13``; a newer major
    first)."""
    found = []
    for root in _site_roots():
        nvidia = root / "nvidia"
        if nvidia.is_dir():
            found += sorted((p for p in nvidia.glob("*/bin/nvcc") if p.is_file()), key=lambda p: p.parts[-3],
                            reverse=True)
    return found


def system_candidates() -> list[tuple[Path, str]]:
    """$CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda: the ones that exist, each with its source."""
    out = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append((Path(os.environ[var]) / "bin" / "nvcc", var))
    on_path = shutil.which("nvcc")
    if on_path:
        out.append((Path(on_path), "PATH"))
    out.append((SYSTEM_ROOT / "bin" / "nvcc", "default"))
    return [(p, s) for p, s in out if p.is_file()]


def candidates() -> list[tuple[Path, str]]:
    """The compilers to try, in order, each with its source (``$ROTVID_NVCC`` narrows or names them)."""
    choice = os.environ.get(ENV, "").strip()
    pip = [(p, "pip") for p in pip_candidates()]
    if choice == "pip":
        return pip
    if choice == "system":
        out = system_candidates()
    elif choice:
        path = Path(choice).expanduser()
        path = path / "bin" / "nvcc" if path.is_dir() else path
        if not path.is_file():
            raise RuntimeError(f"rotvid CUDA kernels: ROTVID_NVCC={choice}: no nvcc there (expected an nvcc, a "
                               "toolkit folder with bin/nvcc, 'pip' or 'system')")
        return [(path, "ROTVID_NVCC")]
    else:
        out = pip + system_candidates()
    seen, unique = set(), []
    for path, source in out:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((path, source))
    return unique


def fit_problem(version: str, nvcc: Path, *, torch_cuda: tuple[int, int] | None,
                driver: tuple[int, int] | None, embeds_ptx: bool = False) -> str:
    """Why the compiler ``nvcc`` of CUDA ``version`` cannot build for this torch and driver ("" when it can)."""
    release = parse_cuda_version(version)
    who = f"nvcc {version} ({nvcc})"
    if torch_cuda is not None:
        wanted = _release_text(torch_cuda)
        if release[0] != torch_cuda[0]:
            return (f"{who} is CUDA {_release_text(release)}, torch {torch.__version__} is built for CUDA {wanted}: "
                    f"the major versions differ (use a CUDA {torch_cuda[0]}.x compiler, at least {wanted})")
        if release < torch_cuda:
            return (f"{who} is CUDA {_release_text(release)}, older than torch {torch.__version__}'s CUDA {wanted} "
                    f"(use a CUDA {wanted} or newer {torch_cuda[0]}.x compiler)")
    if driver is not None:
        if driver[0] < release[0]:
            return (f"{who} is CUDA {_release_text(release)}, the driver supports CUDA {_release_text(driver)} only: "
                    f"what it builds does not run there (update the driver, or use a CUDA {driver[0]}.x compiler)")
        if embeds_ptx and driver < release:
            return (f"{who} is CUDA {_release_text(release)}, the driver supports CUDA {_release_text(driver)} only: "
                    "too old to JIT its PTX (ROTVID_EXT_CUDA_FLAGS asks for code=compute_*); update the driver or "
                    "build SASS only")
    return ""


def _companion_dirs(home: Path, release: tuple[int, int]) -> tuple[tuple[Path, ...], Path | None]:
    """Headers and cudart for a compiler at ``home``: its own when it has them, else those of another pip folder of
    the same CUDA major on ``sys.path`` (torch's ``nvidia-cuda-runtime`` wheel, when rotvid's compiler packages went
    into another folder)."""
    def cudart_in(root: Path) -> Path | None:
        for lib in ("lib64", "lib"):
            for name in ("libcudart.so", f"libcudart.so.{release[0]}"):
                if (root / lib / name).is_file():
                    return root / lib / name
        return None

    includes: list[Path] = []
    cudart = cudart_in(home)
    others = [r / "nvidia" / f"cu{release[0]}" for r in _site_roots()]
    others = [o for o in others if o.is_dir() and os.path.realpath(o) != os.path.realpath(home)]
    if not (home / "include" / "cuda_runtime.h").is_file():
        includes += [o / "include" for o in others if (o / "include" / "cuda_runtime.h").is_file()][:1]
    if not (home / "include" / "cccl").is_dir() and (home / "include" / "crt").is_dir():  # a pip folder
        includes += [o / "include" / "cccl" for o in others if (o / "include" / "cccl").is_dir()][:1]
    if cudart is None:
        cudart = next((c for c in map(cudart_in, others) if c is not None), None)
    return tuple(includes), cudart


def _find(embeds_ptx: bool) -> Toolkit:
    found = candidates()
    if not found:
        where = {"pip": "no pip-installed nvcc on sys.path", "system": "no nvcc in CUDA_HOME, on PATH or in "
                 f"{SYSTEM_ROOT}"}.get(os.environ.get(ENV, "").strip(), "no nvcc: none pip-installed, none in "
                                        f"CUDA_HOME, on PATH or in {SYSTEM_ROOT}")
        raise RuntimeError(f"rotvid CUDA kernels: {where} ({INSTALL_HINT})")
    torch_cuda, driver = torch_cuda_version(), driver_cuda_version()
    refused = []
    for nvcc, source in found:
        try:
            version, home = probe_nvcc(nvcc)
        except RuntimeError as err:
            refused.append(str(err))
            continue
        problem = fit_problem(version, nvcc, torch_cuda=torch_cuda, driver=driver, embeds_ptx=embeds_ptx)
        if problem:
            refused.append(problem)
            continue
        includes, cudart = _companion_dirs(home, parse_cuda_version(version))
        if len(refused):
            logger.info("CUDA compiler: %s passed over (%s)", ", ".join(str(p) for p, _ in found[:len(refused)]),
                        "; ".join(refused))
        return Toolkit(nvcc=nvcc, version=version, source=source, home=home, include_dirs=includes, cudart=cudart)
    hint = "" if torch_cuda is None or torch_cuda[0] != 13 else f" ({INSTALL_HINT})"
    raise RuntimeError("rotvid CUDA kernels: no CUDA compiler fits: " + "; ".join(refused) + hint)


@functools.cache
def _find_cached(key: tuple) -> Toolkit | str:
    try:
        return _find(embeds_ptx=key[-1])
    except RuntimeError as err:
        return str(err)


def find_toolkit(embeds_ptx: bool = False) -> Toolkit:
    """The CUDA compiler the extension builds with (search order and fit: the module docstring); RuntimeError with
    one line naming what was found and why it does not fit. Cached per environment (``$ROTVID_NVCC``,
    ``$CUDA_HOME``, ``$CUDA_PATH``, ``$PATH``, ``sys.path``, torch's CUDA): a check per attention call is cheap."""
    key = (*(os.environ.get(v) for v in (ENV, "CUDA_HOME", "CUDA_PATH", "PATH")), tuple(sys.path),
           torch.version.cuda, embeds_ptx)
    found = _find_cached(key)
    if isinstance(found, str):
        raise RuntimeError(found)
    return found


def clear_cache() -> None:
    """Forget the compilers found (tests; after installing one in a running process)."""
    _find_cached.cache_clear()
    _probe.cache_clear()


def describe_compiler() -> str:
    """One line for `rotvid backends`: the compiler the extension builds with, and torch's and the driver's CUDA;
    or why there is none."""
    torch_cuda, driver = torch_cuda_version(), driver_cuda_version()
    try:
        toolkit = find_toolkit()
    except RuntimeError as err:
        return str(err)
    if torch_cuda is None:
        return f"{toolkit.describe()}; torch {torch.__version__} is a CPU build (the kernels need its CUDA build)"
    tail = f", driver CUDA {_release_text(driver)}" if driver is not None else ""
    return f"{toolkit.describe()}; torch CUDA {_release_text(torch_cuda)}{tail}"
