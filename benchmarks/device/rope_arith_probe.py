import torch, sys
sys.path.insert(0, ".")
from rotvid.kernels.rope_triton import apply_generalized_rope_triton
from rotvid.rope.fused_table import fuse_rope_and_rotation
from rotvid.rope.rotations import make_rotation
from rotvid.rope.tables import rope_table_3d
torch.manual_seed(0)
for spec in ("none", "half"):
    cos, sin = rope_table_3d("wan", (3, 7, 49), 128)
    t = fuse_rope_and_rotation(cos.cuda(), sin.cuda(), make_rotation(spec, 128, (44, 42, 42))).to(dtype=torch.float32)
    x = torch.randn(2, 5, cos.shape[0], 128, device="cuda").to(torch.bfloat16)
    ref = apply_generalized_rope_triton(x, t.coef, t.index)
    g = x.float()[..., t.index]  # [..., N, D, 4]
    c = t.coef
    r32 = lambda v: v.float()
    d = lambda v: v.double()
    def fma(a, b, acc):  # f32 fma, emulated via f64
        return (d(a) * d(b) + d(acc)).float()
    p = [g[..., i] * c[..., i] for i in range(4)]  # rounded products
    cands = {
        "A fma chain": fma(c[..., 3], g[..., 3], fma(c[..., 2], g[..., 2], fma(c[..., 1], g[..., 1], p[0]))),
        "B fma(c0x0, p1)": fma(c[..., 3], g[..., 3], fma(c[..., 2], g[..., 2], fma(c[..., 0], g[..., 0], p[1]))),
        "C no fma seq": ((p[0] + p[1]) + p[2]) + p[3],
        "D no fma tree": (p[0] + p[1]) + (p[2] + p[3]),
        "E fma tree": fma(c[..., 1], g[..., 1], p[0]) + fma(c[..., 3], g[..., 3], p[2]),
        "F fma tree2": fma(c[..., 0], g[..., 0], p[1]) + fma(c[..., 2], g[..., 2], p[3]),
        "G f64 exact": (d(c) * d(g)).sum(-1).float(),
    }
    for k, v in cands.items():
        v = v.to(torch.bfloat16)
        print(spec, k, "equal", torch.equal(v, ref), "mismatch", int((v != ref).sum()), "of", v.numel())
