"""CPU: which CUDA kernel and key-block size the backend picks per compute capability (the arch
table), and the errors of a kernel the GPU cannot run. The GPU itself is faked by patching the
capability lookup; the kernels are tested on the GPU in test_cuda_int4.py."""

import pytest
import torch

from rotvid.kernels import cuda_backend as cb


@pytest.fixture
def gpu_of(monkeypatch):
    def fake(cap):
        monkeypatch.setattr(cb, "_capability", lambda device=None: cap)
        monkeypatch.setattr(cb, "arch_entry", lambda device=None: cb.ARCH_TABLE[cap])
        return torch.device("cuda", 0)

    return fake


def test_hopper_defaults_to_the_wgmma_kernel_at_block_n_128(gpu_of):
    dev = gpu_of((9, 0))
    assert cb._resolve_path("auto", dev) == "wgmma"
    assert cb.default_block_n(dev) == 128
    assert cb._check_path("wgmma", dev) == "wgmma" and cb._check_path(None, dev) == "auto"
    assert cb._resolve_path("s8", dev) == "s8"  # the mma.sync kernel stays reachable


@pytest.mark.parametrize("cap", [(8, 0), (8, 6), (8, 9)])
def test_ampere_and_ada_default_to_native_int4_at_block_n_64(gpu_of, cap):
    dev = gpu_of(cap)
    assert cb._resolve_path("auto", dev) == "s4"
    assert cb.default_block_n(dev) == 64
    with pytest.raises(ValueError, match=rf"path: 'wgmma' needs an sm90 GPU \(Hopper\), this is sm{cap[0]}{cap[1]}"):
        cb._check_path("wgmma", dev)


def test_unknown_path_is_named(gpu_of):
    with pytest.raises(ValueError, match="path: expected one of"):
        cb._check_path("s16", gpu_of((9, 0)))


def test_default_block_n_without_a_gpu_is_the_reference_default():
    from rotvid.kernels.reference import DEFAULT_BLOCK_N

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the no-GPU default is what is tested here")
    assert cb.default_block_n() == DEFAULT_BLOCK_N == 64
