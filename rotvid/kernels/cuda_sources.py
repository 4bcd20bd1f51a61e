"""Which files the CUDA extension is built from, found by folder: the shared skeletons under ``rotvid/kernels/csrc``
(``common/``, ``hopper/``, ``mma/``) and every recipe's own ``csrc/`` folder (``rotvid/kernels/recipes/<name>/csrc``).

A recipe with a kernel brings its folder: its numerics, its entry points and its binding file
(``binding_<name>.cpp``, which registers its functions into the one extension module: ``csrc/common/binding.h``);
nothing here names a recipe, and the arch table (:data:`rotvid.kernels.cuda_build.ARCH_TABLE`) says only how each GPU
builds. Every ``.cu`` and ``.cpp`` file found is compiled and every ``.cuh`` / ``.h`` file is hashed into the
extension's name (:func:`rotvid.kernels.cuda_build.extension_name`), so any change under these folders rebuilds it.

Includes: the build passes one include folder, the shared ``csrc`` (:attr:`CudaSources.include_dirs`). A shared header
is included by its path there (``#include "hopper/hopper_launch.cuh"``), a recipe's own header by its name from the
same folder (``#include "int8fp8_entry.cuh"``). Object files of one build land in one folder, named by their
source's file name, so file names are unique across the folders (:func:`find_sources` raises otherwise).

This module imports nothing but the standard library: ``python rotvid/kernels/cuda_sources.py`` prints the sources
(``.ci/compile_cuda`` compiles the ``.cu`` ones with ``-I`` the include folder, without torch).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

KERNELS = Path(__file__).resolve().parent
SHARED = "csrc"  # the shared skeletons, under the kernels folder; also the one include folder
RECIPES = "recipes"  # each recipe's folder; its CUDA files in its csrc/
SOURCE_SUFFIXES = (".cu", ".cpp")
HEADER_SUFFIXES = (".cuh", ".h")


@dataclass(frozen=True)
class CudaSources:
    """The CUDA extension's files under one kernels folder (``rotvid/kernels``), as absolute paths, sorted.

    Attributes:
        kernels: the kernels folder the files were found under.
        folders: the folders searched, the shared ``csrc`` first, then each recipe's ``csrc`` by recipe folder name.
        sources: the ``.cu`` / ``.cpp`` files the build compiles.
        headers: the ``.cuh`` / ``.h`` files they include (hashed into the extension's name).
        include_dirs: the ``-I`` folders of every compile (the shared ``csrc``).
    """

    kernels: Path
    folders: tuple[Path, ...]
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]
    include_dirs: tuple[Path, ...]

    def relative(self, paths) -> list[str]:
        """``paths`` relative to the kernels folder, POSIX-style (``csrc/common/extension.cpp``)."""
        return [p.relative_to(self.kernels).as_posix() for p in paths]

    def cuda_sources(self) -> tuple[Path, ...]:
        """The ``.cu`` sources (nvcc; the ``.cpp`` binding files need torch's headers and are built by the host
        compiler in the extension build)."""
        return tuple(p for p in self.sources if p.suffix == ".cu")


def source_folders(kernels: Path = KERNELS) -> tuple[Path, ...]:
    """The folders the build takes files from: ``kernels/csrc`` (the shared skeletons) and ``kernels/recipes/*/csrc``
    (each recipe's), the recipes' in folder-name order."""
    kernels = Path(kernels)
    recipes = sorted(p for p in (kernels / RECIPES).glob("*/csrc") if p.is_dir())
    return (kernels / SHARED, *recipes)


def find_sources(kernels: Path = KERNELS) -> CudaSources:
    """Every source and header the extension is built from under ``kernels`` (default: this package's).

    ValueError when the shared ``csrc`` folder is missing or two files of one kind share a file name (objects of one
    build are named by their source's file name; a header name found twice would make an include ambiguous)."""
    kernels = Path(kernels).resolve()
    folders = source_folders(kernels)
    if not folders[0].is_dir():
        raise ValueError(f"rotvid CUDA sources: no shared source folder {folders[0]}")
    files = sorted(f for d in folders for f in d.rglob("*") if f.is_file() and not f.name.startswith("."))
    sources = tuple(f for f in files if f.suffix in SOURCE_SUFFIXES)
    headers = tuple(f for f in files if f.suffix in HEADER_SUFFIXES)
    for kind, group in (("source", sources), ("header", headers)):
        seen: dict[str, Path] = {}
        for f in group:
            if f.name in seen:
                raise ValueError(f"rotvid CUDA sources: two {kind} files named {f.name!r} ({seen[f.name]} and {f}): "
                                 "file names must be unique across csrc/ and the recipes' csrc/ folders")
            seen[f.name] = f
    return CudaSources(kernels=kernels, folders=folders, sources=sources, headers=headers,
                       include_dirs=(kernels / SHARED,))


def main(argv: list[str] | None = None) -> int:
    """``cuda_sources.py [--cu | --include]``: the sources (``--cu``: the ``.cu`` ones; ``--include``: the include
    folders), one absolute path a line."""
    args = sys.argv[1:] if argv is None else argv
    found = find_sources()
    if args == ["--include"]:
        paths = found.include_dirs
    elif args == ["--cu"]:
        paths = found.cuda_sources()
    elif not args:
        paths = found.sources
    else:
        print("usage: python rotvid/kernels/cuda_sources.py [--cu | --include]", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
