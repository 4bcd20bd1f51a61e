"""The one-pass Triton kernel of the generalized RoPE table, run on CPU through Triton's interpreter
(TRITON_INTERPRET=1, in a subprocess so the setting does not leak), and on CUDA when present."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install triton) — the kernel needs it")

CHECK = textwrap.dedent(
    """
    import torch
    import rotvid.pipelines.families  # the built-in families register their RoPE facts (rope_table_3d)
    from rotvid.rope.fused_table import apply_generalized_rope, fuse_rope_and_rotation
    from rotvid.rope.rotations import PairRotation, make_rotation
    from rotvid.rope.tables import rope_table_3d
    from rotvid.kernels.rope_triton import apply_generalized_rope_triton

    torch.manual_seed(0)
    worst = worst32 = 0.0
    for family, grid, d, dtype, spec in [
        ("wan", (2, 3, 5), 128, torch.bfloat16, "half"),
        ("cogvideox", (3, 2, 3), 64, torch.float32, "interleaved"),
        ("hunyuan_video", (1, 3, 4), 128, torch.float16, "none"),
    ]:
        cos, sin = rope_table_3d(family, grid, d)
        segs = {"wan": (44, 42, 42), "cogvideox": (16, 24, 24), "hunyuan_video": (16, 56, 56)}[family]
        table = fuse_rope_and_rotation(cos, sin, make_rotation(spec, d, segs))
        x = torch.randn(2, 3, cos.shape[0], d).to(dtype)
        want = apply_generalized_rope(x, table)          # eager path on CPU
        got = apply_generalized_rope_triton(x.transpose(1, 2).contiguous().transpose(1, 2), table.coef.float(), table.index)
        assert got.dtype == dtype and got.shape == x.shape
        err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        if dtype == torch.float32:
            worst32 = max(worst32, err)
        else:
            worst = max(worst, err)
    # per-head learned table [H, N, D, 4]
    angles = torch.rand(3, 64) * 6.28
    rot = PairRotation.learned(angles, torch.randint(0, 2, (3, 64)), pairing="half", head_dim=128, segments=(44, 42, 42))
    cos, sin = rope_table_3d("wan", (2, 2, 3), 128)
    table = fuse_rope_and_rotation(cos, sin, rot)
    x = torch.randn(1, 3, cos.shape[0], 128)
    want = apply_generalized_rope(x, table)
    got = apply_generalized_rope_triton(x, table.coef.float(), table.index)
    worst32 = max(worst32, ((got - want).abs().max() / want.abs().max()).item())
    print("WORST", worst, "WORST32", worst32)
    """
)


def test_triton_kernel_matches_the_eager_op_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    worst, worst32 = (float(x) for x in r.stdout.rsplit("WORST ", 1)[-1].split(" WORST32 "))
    assert worst < 1e-2  # bf16/fp16 output rounding
    assert worst32 < 1e-5  # float32: the same four-term sums in another order (~1e-7)


def test_bad_shapes_name_the_argument():
    from rotvid.kernels.rope_triton import apply_generalized_rope_triton

    x = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="coef: expected shape"):
        apply_generalized_rope_triton(x, torch.zeros(4, 8, 4), torch.zeros(8, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="x: expected"):
        apply_generalized_rope_triton(x[0], torch.zeros(5, 8, 4), torch.zeros(8, 4, dtype=torch.long))


@pytest.mark.gpu
def test_cuda_kernel_matches_eager_and_pipeline_path():
    from rotvid.kernels.rope_op import apply_generalized_rope
    from rotvid.rope.fused_table import fuse_rope_and_rotation
    from rotvid.rope.rotations import make_rotation
    from rotvid.rope.tables import rope_table_3d

    cos, sin = rope_table_3d("wan", (3, 6, 10), 128)
    table = fuse_rope_and_rotation(cos.cuda(), sin.cuda(), make_rotation("half", 128, (44, 42, 42)))
    x = torch.randn(2, 12, cos.shape[0], 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    out.copy_(apply_generalized_rope(x, table))  # dispatches to the Triton kernel on CUDA
    ref = apply_generalized_rope(x.cpu().double(), fuse_rope_and_rotation(cos, sin, make_rotation("half", 128, (44, 42, 42))))
    assert not torch.isnan(out).any()
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-2
