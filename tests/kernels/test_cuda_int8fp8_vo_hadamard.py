"""The online V/O Hadamard fused into the int8-fp8 CUDA call (sm90): V rotated inside the pre-processing
(preprocess_int8fp8.cu, ``V_HADAMARD``) and O un-rotated in the attention kernel's epilogue or split combine
(``AttnParams.o_hadamard``, rowmath::unrotate_tile_rows, hopper::unrotate_warp_row); the separate O pass
(hadamard_rows.cu, ``rotvid::hadamard_rows``) for the kernels that do not rotate V themselves and the int8-fp8
output at head_dim 64 (where the fused call then gives the PyTorch path's bits exactly).

Bounds: the fused pre-processing writes byte for byte the operands of the pre-processing of
``rotate_v_online(v, D)`` (the PyTorch rotation: same butterflies, same rounding), for both head dims, both layouts,
odd lengths, kv_lens and every smoothing choice, with RoPE·R fused as well; the O pass gives
``unrotate_o_online``'s (and ``rotate_v_online``'s) bits. The kernel's own inverse runs the same butterflies on the
float32 output row and rounds once, where the unfused path (PyTorch rotation, the same kernel, PyTorch inverse)
rounds the rotated output first: the two are one rounding apart (:func:`assert_one_rounding_apart`: the root mean
square of the difference within 4 units of the dtype's rounding of the output's, which a wrong sign or column order
exceeds by orders of magnitude), eager, compiled, split over the keys or not, under a block map, on the mma.sync
kernel and under ring attention's merge; and against float64 attention the fused call keeps the recipe's SQNR floor
and the unfused call's SQNR. Outputs are poisoned (NaN) before each run: a NaN left fails. A NaN in V gives NaN in
the same outputs on both paths."""

import pytest
import torch

from rotvid.kernels import attention, metrics
from rotvid.kernels.cuda_backend import CudaBackend
from rotvid.kernels.dispatch import prepare_attention
from rotvid.kernels.recipes import attention_reference
from rotvid.kernels.recipes.int8_fp8.ops import (
    O_EPILOGUE_HEAD_DIMS, attention_int8fp8_quantized, int8fp8_attention_cuda, preprocess_int8fp8_cuda,
)
from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online
from tests.kernels.helpers import attention_fp64, cuda_qkv
from tests.kernels.test_cuda_int8fp8 import needs_sm90
from tests.kernels.test_cuda_int8fp8_rope import FIELDS, poison_allocator, rotated
from tests.kernels.test_rope_table_cuda import make_table

pytestmark = pytest.mark.gpu


def hop():
    from rotvid.kernels import hadamard_op

    return hadamard_op


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same_operands(got, want, what):
    for name in FIELDS:
        assert torch.equal(bits(getattr(got, name)), bits(getattr(want, name))), f"{what}: {name} differs"


# (b, h, n, d, kv_lens, dtype, layout): odd lengths (CTA and 128-row tile tails), one key, masked keys
CASES = [
    (1, 2, 1, 64, None, torch.float16, "BHND"),
    (1, 3, 97, 128, None, torch.bfloat16, "BNHD"),
    (2, 2, 1025, 128, [1025, 333], torch.float16, "BHND"),
    (2, 3, 300, 64, [1, 257], torch.bfloat16, "BNHD"),
    (1, 2, 4099, 128, None, torch.bfloat16, "BHND"),
    (1, 1, 2500, 64, [2100], torch.float16, "BNHD"),
]
CASE_IDS = [f"b{c[0]}h{c[1]}n{c[2]}d{c[3]}{'lens' if c[4] else ''}{c[6]}" for c in CASES]


@pytest.mark.parametrize("smooth", [(True, False), (False, True), (True, True), (False, False)], ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fused_preprocess_equals_preprocess_of_the_rotated_v(case, smooth):
    needs_sm90()
    b, h, n, d, lens, dtype, layout = case
    smooth_k, smooth_v = smooth
    q, k, v, kv_lens = cuda_qkv(b, h, n, n, d, dtype, layout, seed=n + d, kv_lens=lens)
    opts = dict(layout=layout, kv_lens=kv_lens, smooth_k=smooth_k, smooth_v=smooth_v)
    want = preprocess_int8fp8_cuda(q, k, rotate_v_online(v, d), **opts)
    poison_allocator()
    got = preprocess_int8fp8_cuda(q, k, v, v_hadamard=True, **opts)
    torch.cuda.synchronize()
    assert_same_operands(got, want, f"{case} smooth_k={smooth_k} smooth_v={smooth_v}")
    # the rotation changes V's operands (and only V's)
    plain = preprocess_int8fp8_cuda(q, k, v, **opts)
    if smooth_v and n == 1:  # one token less its own mean is 0 before and after the rotation: the mean carries it
        assert not torch.equal(plain.v_mean, got.v_mean)
    else:
        assert not torch.equal(plain.vt, got.vt)
    for name in ("q_hat", "q_scale", "k_hat", "k_scale"):
        assert torch.equal(bits(getattr(plain, name)), bits(getattr(got, name))), name


@pytest.mark.parametrize("spec", ["half", "full"])
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_fused_v_rotation_with_fused_rope(spec, layout):
    """RoPE·R of Q and K and the rotation of V in the same pre-processing: the operands of the two PyTorch
    rotations followed by the plain pre-processing."""
    needs_sm90()
    table, n = make_table(128, spec, (3, 7, 49), "cuda", seed=5)
    q, k, v, kv_lens = cuda_qkv(2, 5, n, n, 128, torch.bfloat16, layout, seed=9, kv_lens=[n, n // 3])
    opts = dict(layout=layout, kv_lens=kv_lens, smooth_k=True, smooth_v=True)
    want = preprocess_int8fp8_cuda(rotated(q, table, layout), rotated(k, table, layout), rotate_v_online(v, 128),
                                   **opts)
    poison_allocator()
    got = preprocess_int8fp8_cuda(q, k, v, rope=table, v_hadamard=True, **opts)
    torch.cuda.synchronize()
    assert_same_operands(got, want, f"{spec} {layout}")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("side", ["v", "o"])
def test_the_o_pass_gives_the_pytorch_bits(d, dtype, side):
    """One pass over rows (contiguous; a BHND view of BNHD memory, kept as one; a non-dense slice, copied first), the
    row count not a multiple of a CTA's, magnitudes where the order of the float32 sums shows."""
    needs_sm90()
    torch_side = rotate_v_online if side == "v" else unrotate_o_online
    g = torch.Generator(device="cuda").manual_seed(d)
    scale = torch.logspace(-2, 2, d, device="cuda")
    base = (torch.randn(2, 97, 3, d, device="cuda", generator=g) * scale).to(dtype)  # BNHD memory
    for x in (base, base.transpose(1, 2), base.transpose(1, 2).contiguous(), base[:, 5:60]):
        poison_allocator()
        got = hop().vo_hadamard_cuda(x, d, side=side)
        torch.cuda.synchronize()
        want = torch_side(x, d)
        assert got.shape == x.shape and got.dtype == x.dtype
        assert torch.equal(got, want), f"{tuple(x.shape)} {x.stride()}"
        if x.is_contiguous() or x.transpose(1, 2).is_contiguous():
            assert got.stride() == x.stride()  # (a BHND view of BNHD memory stays one: the processors' view)
    # the pair is exactly the identity where no rounding happens: scaled one-hot rows (the ±1 entries and the
    # powers of two are exact)
    hot = torch.eye(d, device="cuda") * torch.randint(-20, 20, (d, 1), device="cuda", generator=g)
    hot = hot.to(dtype).expand(3, d, d).contiguous()
    pair = hop().vo_hadamard_cuda(hop().vo_hadamard_cuda(hot, d, side="v"), d, side="o")
    assert torch.equal(pair, hot)
    assert "block 32" in hop().vo_hadamard_cuda_unsupported(base, 32)
    with pytest.raises(ValueError, match="CUDA float16 / bfloat16"):
        hop().vo_hadamard_cuda(base.float(), d, side=side)


def unfused(q, k, v, d, **opts):
    """The PyTorch path: V rotated, the same CUDA call, the inverse in PyTorch."""
    return unrotate_o_online(attention(q, k, rotate_v_online(v, d), recipe="int8-fp8", backend="cuda", **opts), d)


def assert_fused_matches(got, want, d, what=""):
    """The fused call against the PyTorch path: one rounding apart where the kernel's epilogue turns the output back
    (head_dim 128), the same bits where one pass does (64)."""
    if d in O_EPILOGUE_HEAD_DIMS:
        assert_one_rounding_apart(got, want, what)
    else:
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), what
        assert torch.equal(torch.isnan(got), torch.isnan(want)), what


def assert_one_rounding_apart(got, want, what=""):
    """``got`` (the kernel's inverse on the float32 row, one rounding) against ``want`` (the same rows rounded to the
    dtype, then the inverse, then a rounding): the root mean square of the difference within 4 units u of the
    dtype's rounding (bf16 2^-8, fp16 2^-11) of the output's root mean square (one rounding of each row, spread by
    the orthogonal transform, and the final one: about 1.2 u), the largest within 2^6 u of the largest output; no
    NaN where ``want`` has none."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: NaN where the unfused path has none"
    u = 2.0**-8 if got.dtype == torch.bfloat16 else 2.0**-11
    g, w = got.float().nan_to_num(0.0), want.float().nan_to_num(0.0)
    rms_diff, rms = (g - w).pow(2).mean().sqrt().item(), w.pow(2).mean().sqrt().item()
    assert rms_diff <= 4 * u * rms, f"{what}: rms difference {rms_diff:.3g} > 4 u x rms {rms:.3g}"
    assert (g - w).abs().max().item() <= 64 * u * w.abs().max().item(), what


@pytest.mark.parametrize("smooth_v", [False, True])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fused_call_is_the_pytorch_path_up_to_one_rounding(case, smooth_v):
    needs_sm90()
    b, h, n, d, lens, dtype, layout = case
    q, k, v, kv_lens = cuda_qkv(b, h, n, n, d, dtype, layout, seed=3 * n + d, kv_lens=lens)
    opts = dict(layout=layout, kv_lens=kv_lens, smooth_v=smooth_v)
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="cuda", v_hadamard=d, **opts)
    assert call.v_hadamard_fused
    want = unfused(q, k, v, d, **opts)
    poison_allocator()
    got = attention(q, k, v, recipe="int8-fp8", backend="cuda", vo_hadamard=d, **opts)
    torch.cuda.synchronize()
    assert not torch.isnan(got).any(), "an output element was left unwritten (NaN poison survived)"
    assert got.shape == q.shape
    assert_fused_matches(got, want, d, f"{case} smooth_v={smooth_v}")


@pytest.mark.parametrize("d", [64, 128])
def test_fused_call_vs_float64_and_the_reference_recipe(d):
    needs_sm90()
    q, k, v, _ = cuda_qkv(1, 2, 2049, 2049, d, torch.bfloat16, "BHND", seed=7 * d)
    got = attention(q, k, v, recipe="int8-fp8", backend="cuda", vo_hadamard=d)
    truth = attention_fp64(q, k, v)
    assert metrics.sqnr_db(truth, got.double()) >= 25.0  # the plain call's floor (test_cuda_int8fp8)
    plain = attention(q, k, v, recipe="int8-fp8", backend="cuda")
    assert abs(metrics.sqnr_db(truth, got.double()) - metrics.sqnr_db(truth, plain.double())) < 1.5
    rec = unrotate_o_online(attention_reference(q.float(), k.float(), rotate_v_online(v, d).float(),
                                                recipe="int8-fp8", block_n=128), d)
    assert metrics.cosine_similarity(rec.float(), got.float()) >= 0.9999


def test_fused_call_with_poisoned_outputs_at_each_stage():
    """The kernel's rotated output O' and the O pass's, and the kernel's own inverse, each into memory poisoned with
    NaN first: the O pass on O' gives the PyTorch path's bits, the kernel's inverse is one rounding from them."""
    needs_sm90()
    d, n = 128, 1029
    q, k, v, kv_lens = cuda_qkv(2, 3, n, n, d, torch.bfloat16, "BNHD", seed=31, kv_lens=[n, 500])
    kq = preprocess_int8fp8_cuda(q, k, v, layout="BNHD", kv_lens=kv_lens, v_hadamard=True)
    opts = dict(n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out_dtype=q.dtype, layout="BNHD")
    o_rot = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    attention_int8fp8_quantized(kq, out=o_rot, **opts)
    o_back = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    attention_int8fp8_quantized(kq, out=o_back, o_hadamard=True, **opts)
    torch.cuda.synchronize()
    assert not torch.isnan(o_rot).any() and not torch.isnan(o_back).any()
    poison_allocator()
    out = hop().vo_hadamard_cuda(o_rot, d, side="o")
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    want = unfused(q, k, v, d, layout="BNHD", kv_lens=kv_lens)
    assert torch.equal(out, want)
    assert_one_rounding_apart(o_back, want)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_epilogue_and_the_split_combine_unrotate_alike(d, dtype):
    """The kernel's inverse in the epilogue (split_tail=False) and in the split combine (the last wave's tiles split
    over the keys: few heads, so the grid is one partial wave), dense and under a block map with an empty row, with the
    LSE too: each one rounding from the O pass on the kernel's rotated output, which is the PyTorch path's; the LSE
    does not change."""
    needs_sm90()
    from rotvid.kernels.sparsity import BlockMap

    n = 1500
    q, k, v, kv_lens = cuda_qkv(1, 2, n, n, d, dtype, "BHND", seed=d + 11, kv_lens=[1300])
    kq = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, v_hadamard=True)
    tq = tk = -(-n // 128)
    counts = torch.full((1, 2, tq), tk, dtype=torch.int32, device="cuda")
    counts[0, 1, 3] = 0  # a query tile that keeps no key block: 0 on both paths
    counts[0, 0, 5] = 2
    indices = torch.arange(tk, dtype=torch.int32, device="cuda").expand(1, 2, tq, tk).contiguous()
    block_map = BlockMap(indices, counts, n, n)
    for bmap in (None, block_map):
        for split in (False, True):
            opts = dict(n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out_dtype=dtype, split_tail=split,
                        block_map=bmap)
            o_rot, lse_rot = attention_int8fp8_quantized(kq, return_lse=True, **opts)
            poison_allocator()
            got, lse = attention_int8fp8_quantized(kq, return_lse=True, o_hadamard=True, **opts)
            torch.cuda.synchronize()
            what = f"d={d} {dtype} split={split} map={bmap is not None}"
            assert not torch.isnan(got).any(), what
            assert torch.equal(lse, lse_rot), what
            assert_one_rounding_apart(got, hop().vo_hadamard_cuda(o_rot, d, side="o"), what)
            if bmap is not None:
                assert torch.equal(got[0, 1, 3 * 128:4 * 128], torch.zeros_like(got[0, 1, 3 * 128:4 * 128]))


def test_a_nan_in_v_gives_nan_in_the_same_outputs_on_both_paths():
    needs_sm90()
    d, n = 64, 300
    q, k, v, _ = cuda_qkv(1, 2, n, n, d, torch.bfloat16, "BHND", seed=2)
    v[0, 1, 17, 5] = float("nan")
    got = attention(q, k, v, recipe="int8-fp8", backend="cuda", vo_hadamard=d)
    want = unfused(q, k, v, d)
    assert torch.isnan(got).any()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_fused_matches(got[0, 0], want[0, 0], d)  # (the other head is untouched)
    assert not torch.isnan(got[0, 0]).any()


def test_off_is_the_plain_call_and_other_recipes_rotate_outside_the_kernel():
    needs_sm90()
    q, k, v, _ = cuda_qkv(1, 2, 300, 300, 128, torch.float16, "BNHD", seed=4)
    plain = attention(q, k, v, recipe="int8-fp8", backend="cuda", layout="BNHD")
    assert torch.equal(attention(q, k, v, recipe="int8-fp8", backend="cuda", layout="BNHD", vo_hadamard=1), plain)
    assert torch.equal(int8fp8_attention_cuda(q, k, v, layout="BNHD", v_hadamard=False), plain)
    # an INT4 recipe: V and O rotated around its CUDA kernel by the CUDA pass, with the PyTorch path's bits
    call = prepare_attention(q, k, v, recipe="int4", backend="cuda", layout="BNHD", v_hadamard=128)
    assert not call.v_hadamard_fused
    got = attention(q, k, v, recipe="int4", backend="cuda", layout="BNHD", vo_hadamard=128)
    want = unrotate_o_online(attention(q, k, rotate_v_online(v, 128), recipe="int4", backend="cuda", layout="BNHD"),
                             128)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="v_hadamard"):
        CudaBackend().run(q, k, v, recipe="int4", layout="BNHD", v_hadamard=128)
    # a block smaller than the head_dim: the int8-fp8 call in PyTorch's rotation
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="cuda", layout="BNHD", v_hadamard=32)
    assert not call.v_hadamard_fused
    want = unrotate_o_online(attention(q, k, rotate_v_online(v, 32), recipe="int8-fp8", backend="cuda",
                                       layout="BNHD"), 32)
    assert torch.equal(attention(q, k, v, recipe="int8-fp8", backend="cuda", layout="BNHD", vo_hadamard=32), want)


@pytest.mark.parametrize("d", [64, 128])
def test_fused_call_compiles_fullgraph(d):
    needs_sm90()
    q, k, v, _ = cuda_qkv(1, 2, 300, 300, d, torch.bfloat16, "BNHD", seed=23)

    def f(q, k, v):
        return attention(q, k, v, recipe="int8-fp8", backend="auto", layout="BNHD", vo_hadamard=d)

    explain = torch._dynamo.explain(f)(q, k, v)
    assert explain.graph_break_count == 0, explain.break_reasons
    eager = f(q, k, v)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), eager)
    assert_fused_matches(eager, unfused(q, k, v, d, layout="BNHD"), d)


def runtime_on_cuda(vo):
    from rotvid.pipelines.config import RotvidConfig
    from rotvid.pipelines.report import RunReport
    from rotvid.pipelines.runtime import AttentionSite, Runtime
    from rotvid.pipelines.step_tracker import StepTracker

    tracker = StepTracker()
    tracker.begin(4)
    tracker.set_step(1)
    config = RotvidConfig(recipe="int8-fp8", backend="cuda", vo_hadamard=vo)
    runtime = Runtime(config, tracker, RunReport(recipe="int8-fp8", backend_requested="cuda"))
    site = AttentionSite("transformer", 0, 1, 0, 0, 1)
    runtime.add_site(site, torch.nn.Linear(1, 1))
    return runtime, site


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("key_chunks", [1, 2])
def test_runtime_fused_path_equals_the_pytorch_path_under_ring_attention(key_chunks, d):
    """The runtime's call (BHND views of BNHD memory, run in the BNHD layout, V rotated per key chunk in the
    pre-processing and each chunk's output turned back in its kernel, the chunks merged by their LSE) against the same
    merge of the PyTorch-rotated V's outputs, un-rotated once in PyTorch."""
    needs_sm90()
    n = 2 * 640
    q, k, v, kv_lens = cuda_qkv(2, 3, n, n, d, torch.bfloat16, "BNHD", seed=17, kv_lens=[n, 900])
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # BHND views of BNHD memory, as the processors give them
    mask = torch.arange(n, device="cuda")[None, None, None, :] < kv_lens[:, None, None, None]
    runtime, site = runtime_on_cuda("online")
    poison_allocator()
    got = runtime.attend(site, q, k, v, mask=mask, fp16_attention=lambda: None, key_chunks=key_chunks)
    off, site_off = runtime_on_cuda("off")
    plain = off.attend(site_off, q, k, rotate_v_online(v, d), mask=mask, fp16_attention=lambda: None,
                       key_chunks=key_chunks)
    torch.cuda.synchronize()
    assert not torch.isnan(got).any()
    assert_one_rounding_apart(got, unrotate_o_online(plain, d), f"key_chunks={key_chunks}")
    if key_chunks == 1:  # (the processors' flatten of the output stays a view)
        assert got.transpose(1, 2).is_contiguous()
    runtime.drain_counts()
    assert runtime.report.quantized_calls == 1 and runtime.report.fallback_calls == 0
    truth = attention_fp64(q.cpu(), k.cpu(), v.cpu(), kv_lens=kv_lens.cpu())
    assert metrics.sqnr_db(truth, got.double().cpu()) >= 25.0


@pytest.mark.parametrize("d", [64, 128])
def test_the_mma_sync_kernel_takes_the_same_rotated_operands(d):
    """The sm89 kernel (run on sm90 with path="mma") reads the same pre-processing and turns its output back in the
    same epilogue: one rounding from the PyTorch path there too."""
    needs_sm90()
    q, k, v, kv_lens = cuda_qkv(2, 2, 777, 777, d, torch.float16, "BNHD", seed=d + 1, kv_lens=[777, 400])
    opts = dict(layout="BNHD", kv_lens=kv_lens, path="mma")
    poison_allocator()
    fused = int8fp8_attention_cuda(q, k, v, v_hadamard=True, **opts)
    want = unrotate_o_online(int8fp8_attention_cuda(q, k, rotate_v_online(v, d), **opts), d)
    assert not torch.isnan(fused).any()
    assert_fused_matches(fused, want, d, f"mma d={d}")
