"""The Ulysses path on the SAME attention inputs as one process: what is rounding and what would be a bug.

Full Q, K, V ``[B, H, N, D]`` (+ a key-padding mask with per-batch valid lengths N and 301) are built once, rotated
once (rotation ``none`` / ``half``: the rotator of the applied config, on the full tensors), and then

* one process: the runtime's ``attend`` (:meth:`rotvid.pipelines.runtime.Runtime.attend`, block 0's call site of a
  tiny Wan with the config applied: the schedule's plan, the mask → ``kv_lens``, the backend choice, the block
  map) on the full tensors, all H heads;
* each rank: :func:`~rotvid.pipelines.context_parallel.ulysses_attend` on its sequence shard of the same tensors
  (the mask sharded along the keys as a ``_cp_plan`` shards it), the same ``attend`` inside it on the full
  sequence of its H/P heads;

and rank r's output is compared with rows ``r·N/P .. (r+1)·N/P - 1`` of the single-process output. Every recipe
(fp16, int4, int4-sym-p, int8-fp8) × rotation (none, half) × mask (none, padding), and the block maps (static
``radial`` and top-p ``topp:0.9``, built after the exchange on the full sequence of the rank's heads).

What may differ, and why
------------------------
After the exchange a rank holds, bit for bit, the single process's Q/K/V of its heads (the all-to-all moves
values, it computes nothing; the gathered mask is the full mask). Everything the recipes compute is per (batch,
head): the smoothing means (over the valid tokens of a head), the per-token / per-block quantization, the block
maps, the softmax. The only thing that sees H is how the work is scheduled:

* **CPU, reference backend, fp32** (gloo test): the reference runs the same batched PyTorch operations per (batch,
  head) for H or H/P heads. **The difference must be exactly 0** (asserted bit-equal): any non-zero difference
  means the exchange moved a value to the wrong place (a wrong head, token or key length) -- a logic error.
* **GPU, CUDA kernels, bf16** (NCCL test): the Hopper kernels' *tail split*
  (``rotvid/kernels/csrc/hopper/attn_hopper.cu``, ``wgmma_split_plan``) runs the query tiles of the last, partial wave
  of SMs split over the keys in 2-4 parts, merged by ``combine_splits_kernel``. Which tiles split, and in how many
  parts, depends on the tile count ``B · H · ⌈N/128⌉`` modulo the SM count, so it differs between H and H/P heads.
  A split changes nothing but the fp32 summation order of O and l: the quantized P̂ of every recipe is taken
  relative to the *block* maximum (``csrc/common/rowmath.cuh``, ``online_combine``: "P depends on m_blk only"; the
  int8-fp8 numerics' ``p_fragments`` likewise), not the running one, and the lazy rescaling factors cancel in
  O / l. The pre-processing is per (batch, head) too: the smoothing means are float64 sums of bf16 values, exact
  in any order (``colsum_f64_kernel``), and quantization is per token. So the two fp32 results differ by the
  reordering of at most ``N_kv`` fp32 additions of terms ``≤ max|V|`` each: ``≤ N_kv · 2^-24 · max|V|`` (an
  absolute term; where O is a cancelling sum near 0 it is all there is), and after rounding to bf16 by at most
  **one bf16 ulp of the element**, ``≤ 2^-7 · |o_i|`` (8 significant bits). Per element:

      |cp_i − ref_i| ≤ 2^-7 · |ref_i| + N_kv · 2^-24 · max|V|        (quantized recipes)

  The fp16 recipe runs the model's own attention (SDPA, flash / memory-efficient / cuDNN): their split-KV
  heuristics depend on ``B · H`` as well, and unlike rotvid's kernels they round P to bf16 for the P·V product
  relative to the *running* maximum of each split, so a split rounds P differently: each P element by at most a
  relative 2^-9 in either run, the output by at most ``2 · 2^-9 · max|V|``. Per element:

      |cp_i − ref_i| ≤ 2^-7 · |ref_i| + 2^-8 · max|V|                (fp16 recipe)

  The mask adds nothing: ``kv_lens`` is per batch row and the gathered mask is the single process's mask.
"""

from __future__ import annotations

import pytest
import torch

from tests.pipelines.cp_spawn import finish, gpu_world, join_group, needs_gloo, needs_gpus, run_group

RECIPES = ["fp16", "int4", "int4-sym-p", "int8-fp8"]
ROTATIONS = ["none", "half"]
DENSE_CASES = [(r, rot, masked, "none") for r in RECIPES for rot in ROTATIONS for masked in (False, True)]
SPARSE_CASES = [(r, "half", masked, spec) for r in ("int4", "int8-fp8") for spec in ("radial", "topp:0.9")
                for masked in (False, True)]
CASES = DENSE_CASES + SPARSE_CASES
# B 2, H 4 heads of D 64, the token grid 8 frames x 8 x 8 (512 tokens: 4 key blocks of 128, 256 per rank);
# valid keys per batch row: all, and 301 (a partial key block on each side of the shard boundary)
B, H, D = 2, 4, 64
GRID = (8, 8, 8)
N = GRID[0] * GRID[1] * GRID[2]
LENS = (N, 301)


def _inputs(device, dtype):
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, H, N, D, generator=g) * 1.5
    k = torch.randn(B, H, N, D, generator=g) + 2.0 * torch.randn(1, H, 1, D, generator=g)  # a channel bias
    v = torch.randn(B, H, N, D, generator=g) + torch.randn(1, H, 1, D, generator=g)
    valid = torch.arange(N).unsqueeze(0) < torch.tensor(LENS).unsqueeze(1)
    mask = valid[:, None, None, :]
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), mask.to(device)


def _worker(rank, world, port, folder, out_dir, device_kind, backend):
    import torch.distributed as dist
    from diffusers import WanTransformer3DModel

    from rotvid.kernels.sparsity import TokenGrid
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
    from rotvid.pipelines.context_parallel import UlyssesGroup, ulysses_attend

    device, dtype = join_group(rank, world, port, device_kind)
    group = UlyssesGroup(group=dist.group.WORLD, degree=world, rank=rank)
    tr = WanTransformer3DModel.from_pretrained(f"{folder}/transformer", torch_dtype=dtype).to(device).eval()
    q0, k0, v0, full_mask = _inputs(device, dtype)
    shard = slice(rank * N // world, (rank + 1) * N // world)
    results = {"rank": rank, "cases": []}
    for recipe, rotation, masked, spec in CASES:
        cfg = RotvidConfig(recipe=recipe, rotation=rotation, backend=backend, schedule=Schedule(), sparsity=spec)
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
                v = v0
                mask = full_mask if masked else None

                def attend(q, k, v, m):
                    return runtime.attend(site, q, k, v, mask=m, fp16_attention=lambda: proc._dispatch_fp16(q, k, v, m))

                ref = attend(q, k, v, mask)[:, :, shard].float()
                cp = ulysses_attend(group, q[:, :, shard], k[:, :, shard], v[:, :, shard],
                                    None if mask is None else mask[..., shard], attend).float()
            runtime.end_forward(site.transformer)
            runtime.drain_counts()
            report = handle.report.to_dict()
        finally:
            remove(tr)
        diff = (cp - ref).abs()
        max_v = v0.float().abs().max().item()
        results["cases"].append({
            "recipe": recipe, "rotation": rotation, "masked": masked, "sparsity": spec,
            "bit_equal": bool(torch.equal(cp, ref)), "max_abs": diff.max().item(), "scale": ref.abs().max().item(),
            "max_v": max_v,
            # the per-element bound of the module docstring, as the excess over it (<= 0: within)
            "excess_quantized": (diff - (2.0 ** -7 * ref.abs() + N * 2.0 ** -24 * max_v)).max().item(),
            "excess_fp16": (diff - (2.0 ** -7 * ref.abs() + 2.0 ** -8 * max_v)).max().item(),
            "calls": report["total_calls"], "quantized": report["quantized_calls"],
            "fallbacks": report["fallbacks"], "sparsity_report": (report.get("sparsity") or {}).get("mean_density"),
        })
    finish(out_dir, rank, results)


def _tiny_wan_folder(tiny, tiny_dir):
    tiny("wan")
    return tiny_dir / "wan-4"


def _check(results, *, exact: bool):
    for res in results:
        assert len(res["cases"]) == len(CASES)
        for case in res["cases"]:
            name = (f"rank {res['rank']} {case['recipe']}/{case['rotation']}/"
                    f"{'mask' if case['masked'] else 'no mask'}/{case['sparsity']}")
            assert case["calls"] == 2 and case["fallbacks"] == {}, f"{name}: {case}"
            if case["recipe"] != "fp16":
                assert case["quantized"] == 2, f"{name}: {case}"
            if case["sparsity"] != "none":
                assert case["sparsity_report"] is not None, f"{name}: no block map ran: {case}"
            if exact:
                assert case["bit_equal"], f"{name}: max_abs {case['max_abs']:.3g} (scale {case['scale']:.3g})"
            else:
                key = "excess_fp16" if case["recipe"] == "fp16" else "excess_quantized"
                assert case[key] <= 0, f"{name}: {case}"


def test_ulysses_on_the_same_inputs_is_bit_equal_gloo(tiny, tiny_dir, tmp_path):
    """2 CPU processes over gloo, reference backend, fp32: bit-equal to one process (module docstring)."""
    needs_gloo()
    results = run_group(_worker, (str(_tiny_wan_folder(tiny, tiny_dir)), str(tmp_path), "cpu", "reference"), tmp_path)
    _check(results, exact=True)


@pytest.mark.gpu
def test_ulysses_on_the_same_inputs_nccl(tiny, tiny_dir, tmp_path, monkeypatch):
    """2 GPUs over NCCL (``ROTVID_TEST_GPUS``: 4, one head each), CUDA kernels, bf16: within one bf16 ulp plus the
    fp32 reordering term of the tail split (quantized recipes) or of SDPA's split-KV P rounding (fp16) -- the bounds
    derived in the module docstring."""
    world = gpu_world()
    if H % world:
        pytest.skip(f"{H} heads: Ulysses over {world} GPUs needs a head count it divides")
    needs_gpus(monkeypatch, world)
    results = run_group(_worker, (str(_tiny_wan_folder(tiny, tiny_dir)), str(tmp_path), "cuda", "cuda"), tmp_path,
                        world=world)
    _check(results, exact=False)
