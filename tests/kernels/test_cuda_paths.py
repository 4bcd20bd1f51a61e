"""CPU: which CUDA kernel and key-block size the backend picks per compute capability (the arch
table), and the errors of a kernel the GPU cannot run. The GPU itself is faked by patching the
capability lookup; the kernels are tested on the GPU in test_cuda_int4.py."""

import pytest
import torch

from rotvid.kernels import cuda_build, cuda_layout
from rotvid.kernels.recipes.int4 import ops as int4_ops
from rotvid.kernels.recipes.int8_fp8 import ops as int8_fp8_ops


@pytest.fixture
def gpu_of(monkeypatch):
    def fake(cap):
        monkeypatch.setattr(cuda_build, "capability", lambda device=None: cap)
        monkeypatch.setattr(cuda_build, "arch_entry", lambda device=None: cuda_build.ARCH_TABLE[cap])
        return torch.device("cuda", 0)

    return fake


def test_hopper_defaults_to_the_wgmma_kernel_at_block_n_128(gpu_of):
    dev = gpu_of((9, 0))
    assert int4_ops._resolve_path("auto", dev) == "wgmma"
    assert int4_ops.default_block_n(dev) == 128
    assert int4_ops._check_path("wgmma", dev) == "wgmma" and int4_ops._check_path(None, dev) == "auto"
    assert int4_ops._resolve_path("s8", dev) == "s8"  # the mma.sync kernel stays reachable


@pytest.mark.parametrize("cap", [(8, 0), (8, 6), (8, 9)])
def test_ampere_and_ada_default_to_native_int4_at_block_n_64(gpu_of, cap):
    dev = gpu_of(cap)
    assert int4_ops._resolve_path("auto", dev) == "s4"
    assert int4_ops.default_block_n(dev) == 64
    with pytest.raises(ValueError, match=rf"path: 'wgmma' needs an sm90 GPU \(Hopper\), this is sm{cap[0]}{cap[1]}"):
        int4_ops._check_path("wgmma", dev)


def test_unknown_path_is_named(gpu_of):
    with pytest.raises(ValueError, match="path: expected one of"):
        int4_ops._check_path("s16", gpu_of((9, 0)))


def test_default_block_n_without_a_gpu_is_the_reference_default():
    from rotvid.kernels.reference import DEFAULT_BLOCK_N

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the no-GPU default is what is tested here")
    assert int4_ops.default_block_n() == DEFAULT_BLOCK_N == 64


# ---- the int8-fp8 kernels: wgmma (sm90) and mma.sync e4m3 (sm89, and sm90 on request) ----


@pytest.mark.parametrize("cap,default,kernels", [((9, 0), "wgmma", ("wgmma", "mma")), ((8, 9), "mma", ("mma",))])
def test_int8fp8_kernel_per_compute_capability(cap, default, kernels):
    assert int8_fp8_ops.int8fp8_path_for(cap) == default
    for path in kernels:
        assert int8_fp8_ops.int8fp8_path_for(cap, path) == path
    if cap == (8, 9):
        with pytest.raises(ValueError, match=r"'wgmma' does not run on sm89"):
            int8_fp8_ops.int8fp8_path_for(cap, "wgmma")


@pytest.mark.parametrize("cap", [(8, 0), (8, 6), (8, 7), (7, 5)])
def test_int8fp8_refused_without_fp8_tensor_cores(cap):
    with pytest.raises(ValueError, match=rf"need an sm89 \(mma.sync e4m3\) or sm90 \(Hopper\) GPU, this is sm{cap[0]}{cap[1]}"):
        int8_fp8_ops.int8fp8_path_for(cap)


def test_int8fp8_unknown_path_is_named():
    with pytest.raises(ValueError, match=r"path: expected one of \('wgmma', 'mma'\)"):
        int8_fp8_ops.int8fp8_path_for((9, 0), "s8")


@pytest.mark.parametrize("cap,ok", [((9, 0), True), ((8, 9), True), ((8, 6), False)])
def test_int8fp8_device_problem_and_preprocessing_check(gpu_of, monkeypatch, cap, ok):
    dev = gpu_of(cap)
    monkeypatch.setattr(cuda_build, "_nvcc", lambda: "nvcc")
    problem = int8_fp8_ops.int8fp8_device_problem(0)
    assert cuda_build.device_problem(0) == ""
    if ok:
        assert problem == ""
        assert int8_fp8_ops._check_int8fp8_device(dev) == int8_fp8_ops.int8fp8_kernels(cuda_build.ARCH_TABLE[cap])[0]
    else:
        assert "sm89 (mma.sync e4m3) and sm90 (wgmma) only, this is sm86" in problem
        with pytest.raises(ValueError, match="this is sm86"):
            int8_fp8_ops._check_int8fp8_device(dev)


def test_int8fp8_p_fragment_positions_are_the_score_accumulator_columns():
    """The s8 V^T key permutation serves the e4m3 mma.sync kernel: in m16n8k32 (s8 and e4m3 alike) thread t holds
    A-fragment k positions 4t..4t+3 (a0/a1) and 16+4t..16+4t+3 (a2/a3) of each 32-key step, packed from its score
    accumulator columns (2t, 2t+1) of n-tiles 4s, 4s+1 and 4s+2, 4s+3; V^T must hold those keys there. The keys of
    thread t are K group t ((key mod 8) / 2): one K scale per thread and block."""
    from rotvid.kernels.recipes.int8_fp8.reference import k_group_of_key

    perm = cuda_layout.vt_key_permutation(256, "s8")
    for s in range(8):
        for t in range(4):
            for half in range(2):  # a0/a1 (n-tiles 4s, 4s+1) or a2/a3 (4s+2, 4s+3)
                for i in range(4):
                    pos = 32 * s + 16 * half + 4 * t + i
                    tile = 4 * s + 2 * half + i // 2
                    key = 8 * tile + 2 * t + i % 2
                    assert int(perm[pos]) == key
                    assert int(k_group_of_key(torch.tensor(key % 128))) == t



@pytest.mark.parametrize("bnhd", [False, True])
def test_the_ops_fake_implementations_give_the_kernel_layout(bnhd):
    """The custom ops' fake (shape-only) implementations on meta tensors, as torch.compile traces them: the padded
    operand shapes and dtypes of the kernel layout (cuda_layout.py, the recipes' ops.py), the output in q's layout."""
    ops, meta = torch.ops.rotvid, dict(device="meta")
    q = torch.empty((2, 100, 3, 64) if bnhd else (2, 3, 100, 64), dtype=torch.bfloat16, **meta)
    k = torch.empty((2, 200, 3, 64) if bnhd else (2, 3, 200, 64), dtype=torch.bfloat16, **meta)
    i8, f32, u8 = torch.int8, torch.float32, torch.uint8
    for path, db, vrow, vt in (("s8", 64, 256, i8), ("s4", 32, 128, i8), ("wgmma", 64, 256, u8)):
        got = int4_ops._int4_preprocess_op(q, k, k, None, bnhd, 64, True, True, path, 0, True, 0.1)
        assert [(tuple(t.shape), t.dtype) for t in got] == [
            ((2, 3, 128, db), i8), ((2, 3, 128), f32), ((2, 3, 256, db), i8), ((2, 3, 256), f32),
            ((2, 3, 64, vrow), vt), ((2, 3, 4, 64, 2), f32), ((2, 3, 64), f32), ((2, 3, 256), f32)]
    got = ops.int8fp8_preprocess(q, k, k, None, bnhd, True, False)
    assert [(tuple(t.shape), t.dtype) for t in got] == [
        ((2, 3, 128, 64), i8), ((2, 3, 128), f32), ((2, 3, 256, 64), i8), ((2, 3, 2, 4), f32),
        ((2, 3, 64, 256), i8), ((2, 3, 64), f32), ((0,), f32)]
    q_hat, s = torch.empty((2, 3, 128, 64), dtype=i8, **meta), torch.empty((2, 3, 128), **meta)
    out_shape = (2, 100, 3, 64) if bnhd else (2, 3, 100, 64)
    out = ops.int4_attention(q_hat, s, q_hat, s, q_hat, s, s, None, 100, 200, 64, 64, "s8", 0, 0.1, True, bnhd, True, s)
    assert (tuple(out.shape), out.dtype) == (out_shape, torch.bfloat16)
    out = ops.int8fp8_attention(q_hat, s, q_hat, s, q_hat, s, s, None, 100, 200, 64, 0.1, False, bnhd, "wgmma", True)
    assert (tuple(out.shape), out.dtype) == (out_shape, torch.float16)
    out, lse = ops.int8fp8_attention_lse(q_hat, s, q_hat, s, q_hat, s, s, None, 100, 200, 64, 0.1, True, bnhd, True)
    assert (tuple(out.shape), out.dtype, tuple(lse.shape), lse.dtype) == (out_shape, torch.bfloat16, (2, 3, 100), f32)
