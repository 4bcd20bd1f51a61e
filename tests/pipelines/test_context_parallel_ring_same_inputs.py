"""Ring attention and Ulysses × ring on the SAME attention inputs as one process (gloo on CPU; NCCL on two GPUs).

Full Q, K, V ``[B, H, N, D]`` are built once (K with a different per-channel bias in each quarter of the sequence, so
every key chunk of the ring has its own K mean), rotated once, and then

* one process: the runtime's ``attend`` (block 0's call site of a tiny Wan with the config applied) on the full
  tensors;
* each rank: :func:`~rotvid.pipelines.context_parallel.context_parallel_attend` on its piece of the sequence, with the
  groups of ``ContextParallelConfig(ulysses_degree=U, ring_degree=R)`` set up as diffusers sets them up (flattened
  ``("ring", "ulysses")`` mesh), and the same ``attend`` inside it;

and rank g's output is compared with its piece of the single-process output. Head counts that the world size does
not divide: 3 heads as ring 4 and as ring 2, 6 heads on 4 ranks as Ulysses 2 × ring 2.

What may differ, and the bounds (fp32 on CPU, reference backend):

* ``float`` -- a test recipe with the fp16 recipe's numerics (no quantization) but run as a quantized recipe, so the
  ring path runs it once per key chunk with the LSE and merges: the per-chunk K smoothing (each chunk subtracts its
  own mean) cancels only because the LSE adds the shift back (:mod:`rotvid.pipelines.ring`). Within fp32 rounding
  (relative ``1e-5`` of the output's scale); without the LSE's shift the chunks' weights are off by
  ``exp(sm_scale · q·Δmean)`` -- an error of the output's scale.
* ``fp16`` -- the model's own attention over every key of the ring at once: fp32 rounding (SDPA on N/R query rows
  instead of N).
* quantized recipes (``int4``, ``int8-fp8``) -- the chunks quantize K after their own mean, V with their own scales
  and (int4) Q after the shard's mean, so the two results are two draws of the recipe's quantization noise: the
  difference's RMS must stay within ``sqrt(2)`` times the recipe's own RMS error on these inputs (its single-process
  distance to the fp16 result; measured ~1.2x), its maximum within twice the recipe's maximum error, and the ring
  result's own RMS error within 1.25x the single process's (measured ~1.0-1.1x). A logic error (a wrong chunk, key
  length or weight) moves the output by its own scale.
* a key-padding mask with valid lengths N and 301: with R = 4 the last key chunk (keys 384-511) has no valid key in
  batch row 1 -- it must merge with weight 0 (a NaN or a wrong weight fails the bounds).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.pipelines.cp_spawn import finish, gpu_world, join_group, needs_gloo, needs_gpus, run_group

B, D = 2, 64
GRID = (8, 8, 8)
N = GRID[0] * GRID[1] * GRID[2]  # 512 tokens: 4 key blocks of 128
LENS = (N, 301)
FLOAT = "float-ring"  # the fp16 numerics, run as a quantized recipe (registered in the workers)


def _inputs(heads, device, dtype):
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, heads, N, D, generator=g) * 1.5 + torch.randn(1, heads, 1, D, generator=g)
    k = torch.randn(B, heads, N, D, generator=g) + 2.0 * torch.randn(1, heads, 1, D, generator=g)
    k = k + 1.5 * torch.randn(1, heads, 4, 1, D, generator=g).repeat_interleave(N // 4, dim=2).flatten(2, 3)
    v = torch.randn(B, heads, N, D, generator=g) + torch.randn(1, heads, 1, D, generator=g)
    mask = (torch.arange(N).unsqueeze(0) < torch.tensor(LENS).unsqueeze(1))[:, None, None, :]
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), mask.to(device)


def register_float_recipe():
    from dataclasses import replace

    from rotvid.kernels.recipes import get_recipe, recipe_names, register_recipe

    if FLOAT not in recipe_names():
        register_recipe(replace(get_recipe("fp16"), name=FLOAT, quantized=True))


def groups_for(degrees, rank, world, device_kind):
    """The groups of ``ContextParallelConfig(ulysses_degree=U, ring_degree=R)``, set up as diffusers does."""
    from diffusers import ContextParallelConfig, ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    from rotvid.pipelines.context_parallel import context_parallel_groups

    u, r = degrees
    cp = ContextParallelConfig(ulysses_degree=u, ring_degree=r)
    mesh = init_device_mesh(device_kind, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, world, torch.device(device_kind, rank) if device_kind == "cuda" else torch.device("cpu"),
                 mesh=mesh)
    return context_parallel_groups(config)


def _worker(rank, world, port, folder, out_dir, device_kind, backend, setups, recipes):
    from diffusers import WanTransformer3DModel

    from rotvid.kernels.sparsity import TokenGrid
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
    from rotvid.pipelines.context_parallel import context_parallel_attend

    device, dtype = join_group(rank, world, port, device_kind)
    register_float_recipe()
    tr = WanTransformer3DModel.from_pretrained(f"{folder}/transformer", torch_dtype=dtype).to(device).eval()
    results = {"rank": rank, "cases": []}
    for degrees, heads in setups:
        groups = groups_for(tuple(degrees), rank, world, device_kind)
        piece = groups.world.rank
        shard = slice(piece * N // world, (piece + 1) * N // world)
        q0, k0, v0, full_mask = _inputs(heads, device, dtype)
        twins = {}
        for recipe in ["fp16", *[r for r in recipes if r != "fp16"]]:  # the fp16 twin first
            for masked in (False, True):
                cfg = RotvidConfig(recipe=recipe, rotation="half", backend=backend, schedule=Schedule())
                handle = apply(tr, cfg)
                try:
                    proc = tr.blocks[0].attn1.processor
                    runtime, site = proc.runtime, proc.site
                    handle.tracker.begin(1)
                    handle.tracker.set_step(0)
                    runtime.begin_forward(site.transformer, TokenGrid(*GRID), torch.device(device))
                    with torch.no_grad():
                        q = proc.rotator.rotate(q0, None, (0, N))
                        k = proc.rotator.rotate(k0, None, (0, N))
                        mask = full_mask if masked else None

                        def attend(q, k, v, m, key_chunks=1, runtime=runtime, site=site, proc=proc):
                            return runtime.attend(site, q, k, v, mask=m, key_chunks=key_chunks,
                                                  fp16_attention=lambda: proc._dispatch_fp16(q, k, v, m))

                        ref = attend(q, k, v0, mask).float()
                        cp = context_parallel_attend(groups, q[:, :, shard], k[:, :, shard], v0[:, :, shard],
                                                     None if mask is None else mask[..., shard], attend).float()
                    runtime.end_forward(site.transformer)
                    runtime.drain_counts()
                    report = handle.report.to_dict()
                finally:
                    remove(tr)
                if recipe == "fp16":
                    twins[masked] = ref
                twin = twins[masked]
                ref_s = ref[:, :, shard]
                diff = cp - ref_s
                err = ref_s - twin[:, :, shard]
                results["cases"].append({
                    "degrees": list(degrees), "heads": heads, "recipe": recipe, "masked": masked,
                    "max_abs": diff.abs().max().item(), "rms": diff.pow(2).mean().sqrt().item(),
                    "scale": ref_s.abs().max().item(), "finite": bool(torch.isfinite(cp).all()),
                    "recipe_max": err.abs().max().item(), "recipe_rms": err.pow(2).mean().sqrt().item(),
                    "ring_rms": (cp - twin[:, :, shard]).pow(2).mean().sqrt().item(),
                    "calls": report["total_calls"], "quantized": report["quantized_calls"],
                    "fallbacks": report["fallbacks"],
                })
    finish(out_dir, rank, results)


def _tiny_wan_folder(tiny, tiny_dir):
    tiny("wan")
    return tiny_dir / "wan-4"


def check_cases(results, n_cases, *, float_rel=1e-5, fp16_rel=1e-5):
    for res in results:
        assert len(res["cases"]) == n_cases
        for case in res["cases"]:
            u, r = case["degrees"]
            name = (f"rank {res['rank']} ulysses {u} x ring {r}, {case['heads']} heads, {case['recipe']}/"
                    f"{'mask' if case['masked'] else 'no mask'}")
            assert case["finite"], f"{name}: not finite: {case}"
            assert case["calls"] == 2 and case["fallbacks"] == {}, f"{name}: {case}"  # (one process, then the ring)
            if case["recipe"] == "fp16":
                assert case["max_abs"] <= fp16_rel * case["scale"], f"{name}: {case}"
                continue
            assert case["quantized"] == 2, f"{name}: {case}"
            if case["recipe"] == FLOAT:
                assert case["max_abs"] <= float_rel * case["scale"], f"{name}: {case}"
            else:
                # two draws of the recipe's noise: sqrt(2) x its RMS if independent; and as accurate as one process
                assert case["rms"] <= math.sqrt(2) * case["recipe_rms"], f"{name}: {case}"
                assert case["max_abs"] <= 2 * case["recipe_max"], f"{name}: {case}"
                assert case["ring_rms"] <= 1.25 * case["recipe_rms"], f"{name}: {case}"


RECIPES = [FLOAT, "fp16", "int4", "int8-fp8"]


def test_ring_and_ulysses_x_ring_on_the_same_inputs_gloo_4(tiny, tiny_dir, tmp_path):
    """4 CPU processes: 3 heads as ring 4 (a key chunk with no valid key in a padded row), 6 heads as Ulysses 2 ×
    ring 2."""
    needs_gloo()
    setups = [((1, 4), 3), ((2, 2), 6)]
    results = run_group(_worker, (str(_tiny_wan_folder(tiny, tiny_dir)), str(tmp_path), "cpu", "reference", setups,
                                  RECIPES), tmp_path, deadline_s=400, world=4)
    check_cases(results, len(setups) * len(RECIPES) * 2)


def test_ring_on_the_same_inputs_gloo_2(tiny, tiny_dir, tmp_path):
    """2 CPU processes: 3 heads as ring 2."""
    needs_gloo()
    setups = [((1, 2), 3)]
    results = run_group(_worker, (str(_tiny_wan_folder(tiny, tiny_dir)), str(tmp_path), "cpu", "reference", setups,
                                  RECIPES), tmp_path, world=2)
    check_cases(results, len(setups) * len(RECIPES) * 2)


# (degrees, heads) per GPU count: ring alone on a head count the world does not divide, and Ulysses × ring -- on 8
# GPUs Wan2.1-1.3B's 12 heads as Ulysses 4 × ring 2
NCCL_SETUPS = {2: [((1, 2), 3)], 4: [((1, 4), 3), ((2, 2), 6)], 8: [((1, 8), 3), ((4, 2), 12)]}


@pytest.mark.gpu
def test_ring_on_the_same_inputs_nccl(tiny, tiny_dir, tmp_path, monkeypatch):
    """2 GPUs (``ROTVID_TEST_GPUS``: 4 or 8), bf16, CUDA backend: ring and Ulysses × ring (NCCL_SETUPS) with int8-fp8
    (the Hopper kernel's LSE) against one GPU, within the recipe's noise as on CPU; fp16 (SDPA on all keys) within
    bf16 rounding."""
    world = gpu_world()
    needs_gpus(monkeypatch, world)
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the int8-fp8 kernel that returns the LSE is the Hopper (sm90) one")
    setups = NCCL_SETUPS[world]
    recipes = ["fp16", "int8-fp8"]
    results = run_group(_worker, (str(_tiny_wan_folder(tiny, tiny_dir)), str(tmp_path), "cuda", "cuda", setups,
                                  recipes), tmp_path, deadline_s=400, world=world)
    check_cases(results, len(setups) * len(recipes) * 2, fp16_rel=2 ** -7)
