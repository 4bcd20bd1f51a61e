"""The dispatcher: one clear ValueError per bad input, backend choice explained."""

import pytest
import torch

from rotvid.kernels import attention, select_backend
from tests.kernels.helpers import random_qkv


def qkv(**kw):
    return random_qkv(2, 2, 16, 64, **kw)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda q, k, v: (q[0], k, v), "q: expected a 4-D tensor"),
        (lambda q, k, v: (q, k[..., :32], v[..., :32]), "k: expected batch, heads and head_dim"),
        (lambda q, k, v: (q, k, v[:, :, :8]), "v: expected the same shape as k"),
        (lambda q, k, v: (q.int(), k, v), "q: expected dtype"),
        (lambda q, k, v: (q, k.double(), v), "k, v: expected the same dtype"),
        (lambda q, k, v: (q[..., :63], k[..., :63], v[..., :63]), "q: expected an even head_dim"),
    ],
)
def test_bad_tensors(mutate, match):
    q, k, v = mutate(*qkv())
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, backend="reference")


def test_bad_options():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="recipe: expected one of"):
        attention(q, k, v, recipe="int3")
    with pytest.raises(ValueError, match="layout: expected 'BHND' or 'BNHD'"):
        attention(q, k, v, layout="BSHD")
    with pytest.raises(ValueError, match=r"kv_lens: expected values in \[1, 16\]"):
        attention(q, k, v, kv_lens=torch.tensor([16, 17]))
    with pytest.raises(ValueError, match=r"kv_lens: expected values in \[1, 16\]"):
        attention(q, k, v, kv_lens=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"kv_lens: expected an integer tensor of shape \[2\]"):
        attention(q, k, v, kv_lens=torch.tensor([3]))
    with pytest.raises(ValueError, match="kv_lens: expected an integer dtype"):
        attention(q, k, v, kv_lens=torch.tensor([3.0, 4.0]))
    with pytest.raises(ValueError, match="backend: expected 'auto' or one of"):
        attention(q, k, v, backend="triton")
    with pytest.raises(ValueError, match="block_n: expected a positive int"):
        attention(q, k, v, block_n=0)
    with pytest.raises(ValueError, match="block_n: expected a positive int, got True"):
        attention(q, k, v, block_n=True)  # (a bool is an int to Python: 1-key blocks)
    for bad in (-0.125, 0.0, float("inf"), float("nan"), "0.1", torch.tensor(0.1), True):
        with pytest.raises(ValueError, match="sm_scale: expected a finite number > 0"):
            attention(q, k, v, sm_scale=bad)
    with pytest.raises(ValueError, match="smooth_k: expected True or False, got 'no'"):
        attention(q, k, v, smooth_k="no")  # (a non-empty string is truthy: it would smooth)
    with pytest.raises(ValueError, match="q_block: the Q-smoothing block size, only with smooth_q=True"):
        attention(q, k, v, q_block=64)
    assert attention(q, k, v, sm_scale=0.2, smooth_q=True, q_block=8).shape == q.shape


def test_auto_on_cpu_picks_reference_and_says_why():
    q, k, v = qkv()
    chosen, reason = select_backend(q, k, v, backend="auto", recipe="int4", layout="BHND", kv_lens=None)
    assert chosen.name == "reference"
    assert reason.startswith("reference (auto; cuda:")
    out = attention(q, k, v)  # auto works on CPU
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_rope_argument_rotates_q_and_k_on_the_reference_backend():
    """``attention(..., rope=table)`` attends the RoPE·R-rotated q and k (rotated in the dispatcher when the backend
    does not apply the table itself), in both layouts; a table of the wrong size is refused, naming ``rope``."""
    from rotvid.rope.fused_table import apply_generalized_rope, fuse_rope_and_rotation
    from rotvid.rope.rotations import make_rotation
    from rotvid.rope.tables import rope_table_3d

    cos, sin = rope_table_3d("wan", (2, 3, 4), 128)
    table = fuse_rope_and_rotation(cos, sin, make_rotation("half", 128, (44, 42, 42))).to(dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 24, 128, generator=g) for _ in range(3))
    want = attention(apply_generalized_rope(q, table), apply_generalized_rope(k, table), v, recipe="int8-fp8",
                     backend="reference", block_n=128)
    got = attention(q, k, v, recipe="int8-fp8", backend="reference", block_n=128, rope=table)
    assert torch.equal(got, want)
    t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
    got_bnhd = attention(t(q), t(k), t(v), recipe="int8-fp8", backend="reference", block_n=128, layout="BNHD",
                         rope=table)
    assert torch.equal(got_bnhd.transpose(1, 2), want)
    with pytest.raises(ValueError, match="rope: a table for 24 tokens"):
        attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], recipe="int8-fp8", backend="reference", rope=table)
    with pytest.raises(ValueError, match="rope: expected a GeneralizedRopeTable"):
        attention(q, k, v, recipe="int8-fp8", backend="reference", rope=(cos, sin))
