"""Shared helpers for the kernels' tests: float64 attention and fresh random inputs."""

import torch


def attention_fp64(q, k, v, *, layout="BHND", kv_lens=None, sm_scale=None, block_map=None):
    """softmax(q kᵀ · scale) v in float64, masking keys j >= kv_lens[b] and the key blocks ``block_map`` skips
    (a row left with no key gives 0); returns layout of q."""
    if layout == "BNHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    s = q @ k.transpose(-1, -2) * scale
    if kv_lens is not None:
        j = torch.arange(k.shape[2])
        valid = (j[None, :] < kv_lens[:, None]).view(k.shape[0], 1, 1, -1)
        s = s.masked_fill(~valid, float("-inf"))
    if block_map is not None:
        s = s.masked_fill(~block_map.token_mask(), float("-inf"))
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    out = torch.softmax(s.masked_fill(empty, 0), dim=-1).masked_fill(empty, 0) @ v
    return out.transpose(1, 2) if layout == "BNHD" else out


def random_qkv(b, h, n_q, d, *, n_kv=None, dtype=torch.float32, layout="BHND", seed=None, bias=0.0):
    """Fresh random Q, K, V (never zeros); ``bias`` adds a per-channel offset shared by all tokens."""
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % (2**31))
    n_kv = n_q if n_kv is None else n_kv
    def make(n):
        x = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
        x = x + bias * torch.randn(1, h, 1, d, generator=gen, dtype=torch.float64)
        return x.to(dtype)
    q, k, v = make(n_q), make(n_kv), make(n_kv)
    if layout == "BNHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q, k, v


def cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed, bias=1.0, kv_lens=None):
    """Fresh random Q, K, V on the GPU in ``dtype`` (a shared channel bias of size ``bias``), and ``kv_lens`` as a
    CUDA int64 tensor (or None)."""
    q, k, v = random_qkv(b, h, n_q, d, n_kv=n_kv, dtype=torch.float32, layout=layout, seed=seed, bias=bias)
    q, k, v = (t.to("cuda", dtype) for t in (q, k, v))
    if kv_lens is not None:
        kv_lens = torch.tensor(kv_lens, dtype=torch.int64, device="cuda")
    return q, k, v, kv_lens
