"""Adding a recipe is one folder (for a recipe without a kernel, its ``Recipe`` alone) and one registry line: a toy
recipe registered from this file runs through the kernel-level call, ``apply`` on a tiny pipeline with its run report,
and ``rotvid eval --variants`` (CLI), with no other file touched. It rounds the smoothed Q and K to bf16 and keeps V
and P in float32. A recipe with a CUDA kernel: tests/kernels/test_cuda_sources.py adds a toy recipe's folder."""

import json
from functools import partial

import pytest
import torch

import rotvid.kernels as kernels
from rotvid.kernels.recipes import Recipe, RecipeLabels, get_recipe, recipe_names, register_recipe, unregister_recipe
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise
from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.tiny import build_tiny_pipeline, tiny_call_kwargs
from tests.test_cli import TINY, run, tiny_wan  # noqa: F401  (fixture)

TOY = "bf16-qk"


def bf16_qk_operands(q_s, k_s, v_s, valid, kv_lens):
    return q_s.bfloat16().to(q_s.dtype), k_s.bfloat16().to(k_s.dtype), v_s, None


def plain_pv(p, vb, v_div):
    return torch.matmul(p, vb)


TOY_RECIPE = Recipe(
    name=TOY,
    summary="toy: Q and K rounded to bf16",
    labels=RecipeLabels(datatype="BF16-QK"),
    quantized=True,
    smooth_q=False,
    smooth_v=False,
    reference=partial(attention_blockwise, operands=bf16_qk_operands, block_pv=plain_pv),
    reference_block_n=DEFAULT_BLOCK_N,
)


@pytest.fixture
def toy_recipe():
    register_recipe(TOY_RECIPE)
    try:
        yield TOY_RECIPE
    finally:
        unregister_recipe(TOY)
    assert TOY not in recipe_names()


def test_toy_recipe_is_registered_and_attends(toy_recipe):
    assert get_recipe(TOY) is toy_recipe and TOY in recipe_names() and TOY in kernels.RECIPES
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 50, 64, generator=g) for _ in range(3))
    got = kernels.attention(q, k, v, recipe=TOY, smooth_k=False)
    rounded = kernels.attention(q.bfloat16().float(), k.bfloat16().float(), v, recipe="fp16", smooth_k=False)
    assert torch.equal(got, rounded)
    assert not torch.equal(got, kernels.attention(q, k, v, recipe="fp16", smooth_k=False))
    with pytest.raises(ValueError, match="already registered"):
        register_recipe(TOY_RECIPE)


def test_unregistered_toy_recipe_is_refused_everywhere():
    with pytest.raises(ValueError, match=f"recipe: expected one of .*got '{TOY}'"):
        RotvidConfig(recipe=TOY)
    with pytest.raises(ValueError, match=f"recipe: expected one of .*got '{TOY}'"):
        kernels.attention(torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8), recipe=TOY)


def test_toy_recipe_through_apply_and_the_run_report(toy_recipe, tmp_path):
    pipe = build_tiny_pipeline("wan", tmp_path / "wan", num_layers=2)
    pipe.set_progress_bar_config(disable=True)
    handle = apply(pipe, RotvidConfig(recipe=TOY, rotation="half", schedule="none", backend="auto"))
    try:
        assert (handle.config.recipe, handle.config.smooth_q, handle.config.smooth_v) == (TOY, False, False)
        pipe(**tiny_call_kwargs("wan"))
        report = handle.report
    finally:
        remove(pipe)
    assert report.total_calls > 0 and report.quantized_calls == report.total_calls and report.fallback_calls == 0
    assert report.to_dict()["recipe"] == TOY and report.to_dict()["recipe_reason"] == f"{TOY} as requested"
    assert f"quantized ({TOY})" in report.summary()
    assert all(b.startswith("reference (auto") for b in report.backends), report.backends  # no CUDA kernel: reference


def test_toy_recipe_through_eval_variants(toy_recipe, tiny_wan, tmp_path):  # noqa: F811
    pf = tmp_path / "prompts.txt"
    pf.write_text("a red cat runs\n")
    out = tmp_path / "ev"
    r = run("eval", "--prompt-file", pf, "--model", tiny_wan, "--variants", f"{TOY}:half", *TINY, "--schedule", "none",
            "--out", out)
    assert r.exit_code == 0, r.output
    videos = out / "videos"
    assert sorted(p.name for p in videos.iterdir()) == [f"{TOY}_half", "reference"]
    side = json.loads((videos / f"{TOY}_half" / "000-a-red-cat-runs.json").read_text())
    assert side["recipe"] == TOY and side["fallbacks"] == {}
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"| {TOY}_half |")).split(" | ")
    assert row[1:4] == ["BF16-QK", "–", "Half"]


def test_no_quantized_recipe_name_is_written_outside_the_recipes_package():
    """Code outside ``rotvid/kernels/recipes/`` asks the registry: no string constant equal to a quantized recipe's
    name (``fp16`` is also an outcome and a dtype name, so it is not searched; docs and messages inside longer
    strings are not constants equal to a name)."""
    import ast
    from pathlib import Path

    from rotvid.kernels.recipes import quantized_recipe_names

    names = set(quantized_recipe_names())
    root = Path(__file__).resolve().parent.parent / "rotvid"
    found = []
    for path in root.rglob("*.py"):
        if "recipes" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    assert found == []
