"""CPU: the files the CUDA extension is built from, found by folder (rotvid/kernels/cuda_sources.py).

What must hold: the build of every GPU of the arch table compiles every ``.cu`` / ``.cpp`` file of the shared
``csrc/`` and of each recipe's ``csrc/`` and hashes every header, each file exists and every ``#include "..."`` of
them resolves within the folders the build passes (a shared header by its path under ``csrc/``, a recipe's own from
its folder, never another recipe's); each binding file registers its functions (ROTVID_BINDINGS) and every function
the Python side calls on the extension is bound once; the package ships every file the build needs; and a recipe
with a kernel is one new folder plus one registry line -- a toy recipe's folder is picked up by the source discovery
(its files in the build's list, its includes resolved, the extension's hash changed) and by the registry, with no
shared file changed. No GPU; nvcc only to compile the toy's source where one is on PATH.
"""

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rotvid.kernels import cuda_backend, cuda_build, cuda_sources
from rotvid.kernels.recipes import get_recipe, recipe_names, register_recipe, unregister_recipe

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "rotvid" / "kernels"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
BINDINGS = re.compile(r"^ROTVID_BINDINGS\((\w+),\s*(\w+)\)", re.M)
M_DEF = re.compile(r'\bm\.def\(\s*"(\w+)"')


def resolve_include(including: Path, name: str, include_dirs) -> Path | None:
    """Where a quoted include resolves as nvcc and the host compiler resolve it: the including file's folder first,
    then the -I folders in order; None when nowhere."""
    for folder in (including.parent, *include_dirs):
        if (folder / name).is_file():
            return (folder / name).resolve()
    return None


def include_problems(found: cuda_sources.CudaSources) -> list[str]:
    """The quoted includes of every source and header of ``found`` that resolve nowhere, outside the build's
    headers, to a shared header by a spelling other than its path under ``csrc/`` (working only by where the
    includer sits), or into another recipe's folder."""
    shared = found.kernels / cuda_sources.SHARED
    headers = set(found.headers)
    problems = []
    for f in (*found.sources, *found.headers):
        for name in INCLUDE.findall(f.read_text(encoding="utf-8")):
            target = resolve_include(f, name, found.include_dirs)
            where = f'{f.relative_to(found.kernels)}: #include "{name}"'
            if target is None:
                problems.append(f"{where} resolves nowhere")
            elif target not in headers:
                problems.append(f"{where} resolves to {target}, which the build does not hash")
            elif target.is_relative_to(shared):
                if name != target.relative_to(shared).as_posix():
                    problems.append(f"{where}: a shared header goes by its path under csrc/ "
                                    f"({target.relative_to(shared).as_posix()})")
            elif target.parent != f.parent:
                problems.append(f"{where}: a header of another recipe's folder")
    return problems


def all_files(folders) -> list[Path]:
    return sorted(f for d in folders for f in d.rglob("*") if f.is_file())


@pytest.mark.parametrize("cap", sorted(cuda_build.ARCH_TABLE), ids=lambda c: f"sm{c[0]}{c[1]}")
def test_the_build_of_each_arch_compiles_every_source_and_each_include_resolves(cap):
    found = cuda_sources.find_sources()
    args = cuda_build.compile_args(cap, found)
    assert args["sources"] == [str(p) for p in found.sources]
    assert args["extra_include_paths"] == [str(KERNELS / "csrc")]
    assert cuda_build.ARCH_TABLE[cap].gencode in args["extra_cuda_cflags"]
    assert all(Path(s).is_file() for s in args["sources"]) and all(h.is_file() for h in found.headers)
    # every file of the folders is compiled (sources) or hashed (headers): nothing there is left out
    on_disk = all_files(found.folders)
    assert on_disk == sorted((*found.sources, *found.headers)), [f for f in on_disk if f.suffix not in
                                                                 (*cuda_sources.SOURCE_SUFFIXES,
                                                                  *cuda_sources.HEADER_SUFFIXES)]
    assert include_problems(found) == []
    rel = found.relative(found.sources)
    assert "csrc/common/extension.cpp" in rel  # the module that runs every binding block
    # the shared skeletons and both kernel recipes' folders are there
    assert {"csrc/common", "csrc/hopper", "csrc/mma", "recipes/int4/csrc", "recipes/int8_fp8/csrc"} <= {
        str(Path(r).parent) for r in found.relative((*found.sources, *found.headers))}


def test_each_binding_file_registers_its_functions_and_every_called_function_is_bound_once():
    found = cuda_sources.find_sources()
    blocks, defined = [], []
    for src in found.sources:
        text = src.read_text(encoding="utf-8")
        names = BINDINGS.findall(text)
        defs = M_DEF.findall(text)
        if src.name == "extension.cpp":  # the module: runs the blocks, binds nothing itself, names no recipe
            assert "PYBIND11_MODULE" in text and not defs and not names
            continue
        assert "PYBIND11_MODULE" not in text, f"{src}: one module per extension (common/extension.cpp)"
        if defs:
            assert len(names) == 1 and src.name.startswith("binding_"), f"{src}: m.def outside a ROTVID_BINDINGS block"
        blocks += [n for n, _ in names]
        defined += defs
    assert len(blocks) == len(set(blocks)) and len(defined) == len(set(defined))
    # a binding file per kernel recipe folder, in the folder
    for folder in found.folders[1:]:
        assert [p.name for p in folder.glob("binding_*.cpp")], f"{folder}: no binding file"
    assert set(called_on_the_extension()) <= set(defined)
    assert {"preprocess_int4", "attention_int4", "preprocess_int8fp8", "attention_int8fp8", "hadamard_rows",
            "generalized_rope"} <= set(called_on_the_extension())


def called_on_the_extension() -> set[str]:
    """The functions the Python side calls on the loaded extension: ``load_extension(...).NAME(...)`` and
    ``ext.NAME(...)`` where ``ext = ....load_extension(...)``."""
    names = set()
    for path in [*sorted((ROOT / "rotvid").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        loaded = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and is_load(node.value)
                  for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if is_load(owner) or (isinstance(owner, ast.Name) and owner.id in loaded):
                    names.add(node.func.attr)
    return names


def is_load(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load_extension"


def test_file_names_are_unique_across_the_folders(tmp_path):
    kernels = copy_kernel_tree(tmp_path)
    (kernels / "recipes" / "int4" / "csrc" / "rope_table.cu").write_text("// a second rope_table.cu\n")
    with pytest.raises(ValueError, match="two source files named 'rope_table.cu'"):
        cuda_sources.find_sources(kernels)


def test_the_extension_hash_covers_every_source_and_header(tmp_path):
    """A change to any file under the folders rebuilds the extension (rope_rows.cuh was once missing from the hash,
    so an edit to it alone reused a stale build)."""
    kernels = copy_kernel_tree(tmp_path)
    before = cuda_build._source_hash("13.0", cuda_sources.find_sources(kernels))
    assert before == cuda_build._source_hash("13.0", cuda_sources.find_sources(kernels))
    for rel in ("csrc/common/rope_rows.cuh", "csrc/common/binding.h", "recipes/int8_fp8/csrc/int8fp8_entry.cuh",
                "recipes/int4/csrc/binding_int4.cpp"):
        path = kernels / rel
        text = path.read_text()
        path.write_text(text + "// edited\n")
        assert cuda_build._source_hash("13.0", cuda_sources.find_sources(kernels)) != before, rel
        path.write_text(text)


def test_the_package_ships_every_file_the_build_needs(tmp_path):
    """pyproject.toml's package data, as setuptools' build_py reads it: the built package's kernels folder holds the
    same sources and headers (by path) as this tree's."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "rotvid", src / "rotvid", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "built"
    res = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "-d",
                          str(out)], cwd=src, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    built, here = cuda_sources.find_sources(out / "rotvid" / "kernels"), cuda_sources.find_sources()
    assert built.relative(built.sources) == here.relative(here.sources)
    assert built.relative(built.headers) == here.relative(here.headers)


# ---- a recipe with a kernel: one folder, one registry line ---------------------------------------------------------

TOY = "toy-halve"
TOY_INIT = '''"""A toy recipe with a CUDA kernel: the fp16 numerics in the reference; its kernel halves the output (a stand-in)."""
from functools import partial

import torch

from rotvid.kernels import cuda_build, cuda_checks
from rotvid.kernels.recipes.base import KernelEntry, Recipe, RecipeLabels
from rotvid.kernels.recipes.fp16 import block_pv, unquantized_operands
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise


def run(q, k, v, **opts):
    return cuda_build.load_extension(q.device).toy_halve(q)


RECIPE = Recipe(
    name="toy-halve", summary="toy", labels=RecipeLabels(datatype="TOY"), quantized=True, smooth_q=False,
    smooth_v=False, reference=partial(attention_blockwise, operands=unquantized_operands, block_pv=block_pv),
    reference_block_n=DEFAULT_BLOCK_N,
    kernels={"cuda": KernelEntry(run=run, checks=cuda_checks.FIRST_CHECKS, block_n=lambda device=None: 64)},
)
'''
TOY_ENTRY = '''// The toy recipe's entry point.
#pragma once
#include <cuda_runtime.h>

#include "common/attention_params.cuh"

namespace rotvid {
cudaError_t launch_toy_halve(const HadamardRowsParams& p, cudaStream_t stream);
}  // namespace rotvid
'''
TOY_CU = '''// The toy recipe's kernel: each row's values halved (a shared header of csrc/ and its own entry point).
#include <cuda_fp16.h>

#include "common/attention_params.cuh"
#include "common/rope_rows.cuh"
#include "toy_entry.cuh"

namespace rotvid {
__global__ void toy_halve_kernel(const HadamardRowsParams p) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.rows * p.D)
    static_cast<__half*>(p.out)[i] = __float2half(0.5f * roperows::to_f32(static_cast<const __half*>(p.x)[i]));
}

cudaError_t launch_toy_halve(const HadamardRowsParams& p, cudaStream_t stream) {
  const long long n = p.rows * p.D;
  toy_halve_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}
}  // namespace rotvid
'''
TOY_BINDING = '''// The toy recipe's binding.
#include "common/binding.h"
#include "toy_entry.cuh"

namespace {

using namespace rotvid::ext;

at::Tensor toy_halve(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kHalf && x.is_contiguous(), "x: contiguous fp16 CUDA");
  at::Tensor out = at::empty_like(x);
  rotvid::HadamardRowsParams p{};
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.rows = x.numel() / x.size(-1);
  p.D = (int)x.size(-1);
  check_cuda(rotvid::launch_toy_halve(p, c10::cuda::getCurrentCUDAStream()), "toy_halve");
  return out;
}

}  // namespace

ROTVID_BINDINGS(toy_halve, m) { m.def("toy_halve", &toy_halve, "the toy recipe's kernel"); }
'''


def copy_kernel_tree(tmp_path: Path) -> Path:
    """The CUDA folders of this tree (the shared csrc/ and each recipe's csrc/) under ``tmp_path/kernels``."""
    kernels = tmp_path / "kernels"
    for folder in cuda_sources.source_folders():
        shutil.copytree(folder, kernels / folder.relative_to(KERNELS))
    return kernels


@pytest.fixture
def toy_folder(tmp_path):
    """A copy of this tree's CUDA folders and the toy recipe's new folder beside them: ``(kernels, files before the
    toy as {path: bytes})``."""
    kernels = copy_kernel_tree(tmp_path)
    before = {p.relative_to(kernels).as_posix(): p.read_bytes() for p in all_files([kernels])}
    toy = kernels / "recipes" / "toy_halve"
    (toy / "csrc").mkdir(parents=True)
    (toy / "__init__.py").write_text(TOY_INIT)
    (toy / "csrc" / "toy_entry.cuh").write_text(TOY_ENTRY)
    (toy / "csrc" / "attn_toy_halve.cu").write_text(TOY_CU)
    (toy / "csrc" / "binding_toy_halve.cpp").write_text(TOY_BINDING)
    return kernels, before


def test_a_recipe_with_a_kernel_is_one_folder_and_one_registry_line(toy_folder):
    kernels, before = toy_folder
    base = cuda_sources.find_sources(kernels)
    # the folder alone: the build's list now holds its sources and headers, every include resolves, the extension's
    # hash (its name and cache folder) moves, and no file that was there changed
    toy_files = {"recipes/toy_halve/csrc/attn_toy_halve.cu", "recipes/toy_halve/csrc/binding_toy_halve.cpp"}
    assert toy_files <= set(base.relative(base.sources))
    assert "recipes/toy_halve/csrc/toy_entry.cuh" in base.relative(base.headers)
    for cap in cuda_build.ARCH_TABLE:
        assert {str(kernels / f) for f in toy_files} <= set(cuda_build.compile_args(cap, base)["sources"])
    assert include_problems(base) == []
    without = {k for k in before}
    assert set(base.relative((*base.sources, *base.headers))) - without == {*toy_files,
                                                                            "recipes/toy_halve/csrc/toy_entry.cuh"}
    assert {p.relative_to(kernels).as_posix(): p.read_bytes() for p in all_files([kernels])
            if not p.is_relative_to(kernels / "recipes" / "toy_halve")} == before
    with_toy = cuda_build._source_hash("13.0", base)
    shutil.rmtree(kernels / "recipes" / "toy_halve" / "csrc")
    assert cuda_build._source_hash("13.0", cuda_sources.find_sources(kernels)) != with_toy
    # the registry line: the recipe is known everywhere the registry is asked, with its CUDA kernel entry
    spec = importlib.util.spec_from_file_location("toy_halve_recipe", kernels / "recipes" / "toy_halve" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register_recipe(module.RECIPE)
    try:
        assert TOY in recipe_names() and get_recipe(TOY).kernel("cuda") is not None
        assert TOY in cuda_backend.CudaBackend._entries()
    finally:
        unregister_recipe(TOY)
    assert TOY not in recipe_names()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH: the toy's source is not compiled here")
def test_the_toy_recipe_source_compiles_with_the_build_s_include_folder(toy_folder, tmp_path):
    kernels, _ = toy_folder
    found = cuda_sources.find_sources(kernels)
    src = kernels / "recipes" / "toy_halve" / "csrc" / "attn_toy_halve.cu"
    res = subprocess.run(["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_80,code=sm_80",
                          *(f"-I{d}" for d in found.include_dirs), "-c", str(src), "-o", str(tmp_path / "toy.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
