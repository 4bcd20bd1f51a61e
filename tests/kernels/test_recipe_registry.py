"""The recipe registry and a recipe's CUDA kernel entry seen from the dispatcher (CPU: no kernel runs)."""

from dataclasses import replace

import pytest
import torch

from rotvid.kernels import dispatch
from rotvid.kernels.recipes import get_recipe, quantized_recipe_names, recipe_names, register_recipe, recipes
from rotvid.kernels.recipes.auto import auto_table, fallback_choice


def test_builtin_recipes_in_order_with_their_facts():
    assert recipe_names() == ("fp16", "int4", "int4-sym-p", "int8-fp8", "int4-fp8", "nvfp4")
    assert quantized_recipe_names() == recipe_names()[1:]
    assert {r.name for r in recipes() if "cuda" in r.kernels} == {"int4", "int4-sym-p", "int8-fp8"}
    assert [get_recipe(n).default_block_n("reference") for n in recipe_names()] == [64, 64, 64, 128, 64, 64]
    assert get_recipe("int8-fp8").default_block_n("cuda") == 128
    assert fallback_choice().recipe == "int4" and auto_table()[(9, 0)].recipe == "int8-fp8"


def test_registry_refuses_duplicates_and_conflicting_auto_rows():
    int4 = get_recipe("int4")
    with pytest.raises(ValueError, match="already registered"):
        register_recipe(int4)
    with pytest.raises(ValueError, match=r"auto on sm90 is already 'int8-fp8'"):
        register_recipe(replace(int4, name="other", auto_on={(9, 0): "mine"}, auto_elsewhere=""))
    with pytest.raises(ValueError, match="auto_elsewhere is already 'int4'"):
        register_recipe(replace(int4, name="other", auto_on={}))
    with pytest.raises(ValueError, match="name: expected"):
        replace(int4, name="auto")
    assert "other" not in recipe_names()


def test_the_dispatcher_names_the_check_that_refused():
    q = torch.zeros(1, 1, 8, 64)
    assert dispatch.refusing_check("cuda", q, q, q, recipe="nvfp4")[0] == "recipe"
    if not torch.cuda.is_available():
        name, reason = dispatch.refusing_check("cuda", q, q, q, recipe="int4")
        assert name == "cuda_gpu" and "no CUDA GPU" in reason
    assert dispatch.refusing_check("reference", q, q, q, recipe="int4") is None
