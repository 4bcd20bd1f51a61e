"""``recipe="auto"``: the table per compute capability (device capability mocked: no GPU needed)."""

import pytest
import torch

from rotvid.kernels.cuda_build import ARCH_TABLE
from rotvid.kernels.recipes import auto as recipe_table
from rotvid.kernels.recipes.auto import FALLBACK_CHOICE, RECIPE_TABLE, auto_recipe, resolve_recipe
from rotvid.pipelines.config import PIPELINE_RECIPES


@pytest.fixture
def gpu_of(monkeypatch):
    """``gpu_of((9, 0))``: make every CUDA device report that compute capability."""

    def set_cap(cap):
        monkeypatch.setattr(recipe_table, "_device_capability",
                            lambda device: cap if device.type == "cuda" else None)

    return set_cap


@pytest.mark.parametrize(
    "cap,recipe,why",
    [
        ((9, 0), "int8-fp8", "no INT4 tensor cores on Hopper"),
        ((8, 0), "int4", "native INT4 tensor cores"),
        ((8, 6), "int4", "native INT4 tensor cores"),
        ((8, 7), "int4", "native INT4 tensor cores"),
        ((8, 9), "int4", "no Ada GPU"),
        ((7, 5), "int4", "not in the table"),  # Turing: no rotvid kernel, the reference runs
        ((10, 0), "int4", "not in the table"),  # Blackwell: no rotvid kernel yet
        ((12, 0), "int4", "not in the table"),
    ],
)
def test_auto_recipe_per_compute_capability(gpu_of, cap, recipe, why):
    gpu_of(cap)
    got, reason = auto_recipe(torch.device("cuda", 0))
    assert got == recipe
    assert reason.startswith(f"auto on sm{cap[0]}{cap[1]}:") and why in reason, reason
    assert resolve_recipe("auto", "cuda:0") == (got, reason)


def test_auto_recipe_on_the_cpu_is_the_papers_int4_on_the_reference():
    recipe, reason = auto_recipe("cpu")
    assert recipe == "int4" and reason.startswith("auto on cpu:") and "reference" in reason


def test_auto_recipe_without_a_gpu_uses_the_cpu_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto_recipe() == auto_recipe("cpu")
    # a CUDA device named on a machine without a GPU: the fallback, saying so
    recipe, reason = auto_recipe("cuda:0")
    assert recipe == FALLBACK_CHOICE.recipe and "no CUDA GPU" in reason


def test_explicit_recipe_is_kept_on_every_gpu(gpu_of):
    for cap in ((9, 0), (8, 9), (8, 0)):
        gpu_of(cap)
        for recipe in PIPELINE_RECIPES:
            got, reason = resolve_recipe(recipe, "cuda:0")
            assert got == recipe and reason.startswith(f"{recipe} as requested"), reason
            # on Hopper a 4-bit recipe's reason names the faster, more accurate 8-bit one that auto picks there
            hopper_4bit = cap == (9, 0) and recipe.startswith("int4")
            assert ("int8-fp8" in reason and "slower" in reason) == hopper_4bit, (cap, recipe, reason)
            assert (reason == f"{recipe} as requested") == (not hopper_4bit)


def test_table_covers_every_arch_with_a_cuda_kernel_and_names_quantized_recipes():
    assert set(RECIPE_TABLE) == set(ARCH_TABLE)
    for choice in (*RECIPE_TABLE.values(), FALLBACK_CHOICE):
        assert choice.recipe in PIPELINE_RECIPES and choice.recipe != "fp16" and choice.reason
