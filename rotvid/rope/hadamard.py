"""Normalized Hadamard matrices and the offline V/O Hadamard fusion into attention weights.

RotateAttention (paper Eq. 13-14) rotates V by a per-head Hadamard H_D and undoes it in the
output projection: with V_h = X W_{v,h} for head h,

    O = concat_h(P_h V_h H) (H^T W_o per head) = concat_h(P_h V_h) W_o,

so the weights can be rewritten once, offline, at zero inference cost. In ``nn.Linear`` terms
(``y = x @ W.T + b``, W [out, in]) that is, per head h with rows/columns r_h = h*D:(h+1)*D:

* value projection:  ``W_v[r_h, :] <- H^T @ W_v[r_h, :]`` and ``b_v[r_h] <- H^T @ b_v[r_h]``
  (so each head's value row-vector becomes ``v_h @ H``);
* output projection: ``W_o[:, r_h] <- W_o[:, r_h] @ H``.

Every value stream that is attended to together must get the same H and every projection that
reads the attention output must get H^T: in diffusers modules that means ``to_v`` (or the V slice
of a fused ``to_qkv`` / ``to_kv``) *and* the text branch ``add_v_proj`` (or the V slice of
``to_added_qkv`` / ``to_added_kv``), and ``to_out[0]`` *and* ``to_add_out``. HunyuanVideo's
single-stream blocks build their attention with ``pre_only=True`` (no ``to_out``): the attention
output is concatenated with the MLP branch and read by the block's ``proj_out``, whose first
``inner_dim`` input columns are W_o; pass that layer as ``output_projection`` (or call
:func:`fuse_v_hadamard_single_stream` on the block).

A head_dim D that is not a power of two takes a block-diagonal Hadamard: ``I_{D/b} ⊗ H_b`` with b the
largest power of two dividing D (:func:`vo_hadamard_block`; ``block=`` of the fusion functions). It is
orthogonal and symmetric like H_D, so the algebra above holds unchanged; it mixes only b channels at a
time (b = 4 for D = 12, 2 for D = 10; an odd D has b = 1, the identity: nothing to fuse).
"""

from __future__ import annotations

import logging
import struct

import torch
from torch import nn

__all__ = [
    "hadamard_matrix",
    "fwht",
    "fuse_v_hadamard",
    "unfuse_v_hadamard",
    "is_v_hadamard_fused",
    "vo_hadamard_block",
    "unfused_v_hadamard_values",
    "block_hadamard_matrix",
    "fuse_v_hadamard_single_stream",
    "unfuse_v_hadamard_single_stream",
    "VO_HADAMARD_MODES",
    "rotate_v_online",
    "unrotate_o_online",
    "vo_hadamard_exponent",
]

# How the V/O Hadamard runs (``RotvidConfig.vo_hadamard``): ``online`` -- V·H before a quantized call and its
# inverse on that call's output, no weight touched; ``fused`` -- the paper's offline fusion into W_v / W_o (zero
# run-time cost; the weights are rewritten while applied); ``off`` -- none.
VO_HADAMARD_MODES = ("online", "fused", "off")

logger = logging.getLogger(__name__)

# Module attribute recording the fusion (plain attribute: not a parameter, not in state_dict).
FUSED_ATTR = "_rotvid_v_hadamard"


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> torch.Tensor:
    """Normalized Sylvester Hadamard matrix H_n = H_2 ⊗ H_{n/2}, entries ±n^{-1/2}.

    H_n is symmetric and orthogonal (H_n @ H_n = I). n must be a power of two (1 allowed).
    Returns [n, n] in ``dtype``.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or n & (n - 1):
        raise ValueError(f"n must be a power of two >= 1, got {n!r}")
    h = torch.ones(1, 1, dtype=torch.float64)
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(h2, h)
    return (h * (n ** -0.5)).to(dtype=dtype, device=device)


def vo_hadamard_block(head_dim: int) -> int:
    """The largest power of two dividing ``head_dim``: the block of the V/O Hadamard (``head_dim`` itself for a
    power of two, 4 for 12, 2 for 10, 1 — nothing to fuse — for an odd head_dim)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim: expected a positive int, got {head_dim!r}")
    return head_dim & -head_dim


def block_hadamard_matrix(head_dim: int, block: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``I_{head_dim/block} ⊗ H_block`` ([head_dim, head_dim], symmetric and orthogonal); ``block`` a power of two
    dividing ``head_dim`` (``block == head_dim``: :func:`hadamard_matrix`)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1) or head_dim % block:
        raise ValueError(
            f"head_dim {head_dim}: the V/O Hadamard needs a power-of-two block dividing it, got block={block!r} "
            f"(vo_hadamard_block({head_dim}) = {vo_hadamard_block(head_dim)}); or set vo_hadamard=False"
        )
    h = hadamard_matrix(block)
    return torch.block_diag(*([h] * (head_dim // block))).to(dtype)


# D^-1/2 rounded to float32 for D = 1, 2, 4, ..., 2^16, as Python floats (a module constant, so a compiled graph reads
# it without a host round trip): the product of a float32 tensor with such a scalar is the correctly rounded float32
# product however the scalar is carried, which is the kernels' float32 constant times the value.
_INV_SQRT_F32 = {1 << k: struct.unpack("f", struct.pack("f", (1 << k) ** -0.5))[0] for k in range(17)}


def _inv_sqrt(d: int, dtype: torch.dtype) -> float:
    """D^-1/2 in ``dtype`` (float64, or float32 as :data:`_INV_SQRT_F32`)."""
    if dtype == torch.float64:
        return d**-0.5
    if d not in _INV_SQRT_F32:
        raise ValueError(f"x: head_dim {d} is beyond the float32 table (powers of two up to 2^16)")
    return _INV_SQRT_F32[d]


def fwht(x: torch.Tensor) -> torch.Tensor:
    """``x @ hadamard_matrix(D)`` over the last dim (D a power of two) by the fast Walsh–Hadamard transform.

    log2(D) butterfly stages, stage s first for s = 0, 1, ...: channels i and i + 2^s (bit s of i clear) become
    (x_i + x_{i+2^s}, x_i - x_{i+2^s}); then one multiply by D^-1/2. Computed in float32 (float64 for float64
    x), rounded once to x.dtype. That order is the definition: the CUDA kernels that apply the full Hadamard
    (``rope_rows.cuh``) run the same additions in the same order, so they give these bits. Each output is a
    sum of D terms formed by a D-leaf tree, not the matmul's order, so it may differ from ``x @ H`` in the last
    bits (float32 rounding).
    """
    d = x.shape[-1]
    if d < 1 or d & (d - 1):
        raise ValueError(f"x: the last dim must be a power of two, got {tuple(x.shape)}")
    cd = _compute_dtype(x.dtype)
    return (_butterflies(x.to(cd)) * _inv_sqrt(d, cd)).to(x.dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64, else float32: what the transforms here compute in (the CUDA kernels' float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _butterflies(y: torch.Tensor) -> torch.Tensor:
    """The unnormalized Walsh–Hadamard transform over the last dim of ``y`` (a power of two), in y's dtype: stage
    s = 0, 1, ... maps channels i and i + 2^s (bit s of i clear) to (x_i + x_{i+2^s}, x_i - x_{i+2^s}). The order
    of :func:`fwht` and of the CUDA kernels' ``roperows::wht8``; a new contiguous tensor (y itself for a last dim of
    1)."""
    d = y.shape[-1]
    lead = y.shape[:-1]
    h = 1
    while h < d:
        y = y.reshape(*lead, d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(*lead, d)


# ---- the online V/O Hadamard ------------------------------------------------------------------------------------
# V·H before a quantized call and O·H after it (H symmetric and orthogonal: its own inverse), H = I ⊗ H_block. Both
# sides run the unnormalized fast Walsh–Hadamard transform of each block (:func:`_butterflies`, :func:`fwht`'s order)
# and then multiply by a power of two: V by 2^-ceil(k/2), O by 2^-floor(k/2) with block = 2^k (1/16 and 1/8 for 128, 1/8
# and 1/8 for 64), so that the pair is exactly the identity in exact arithmetic (H_±1 · H_±1 = block · I). The additions
# run in float32 (float64 for float64 inputs) and the result is rounded once to the input's dtype: the CUDA kernels that
# apply the rotation themselves (the int8-fp8 pre-processing for V, ``hadamard_rows.cu`` for O;
# :mod:`rotvid.kernels.hadamard_op`) run the same additions in the same order, so they give these bits; the int8-fp8
# attention kernel's own inverse (its epilogue, head_dim 128) rounds the float32 row once, one rounding from this path.
# V's scale does not matter to any recipe (its quantization scales are per channel), and V·H stays within 2^floor(k/2)
# times max|V| (8× for D=128), far from fp16's range at the magnitudes models give V.
def vo_hadamard_exponent(block: int, side: str) -> int:
    """The power of two of one side of the online V/O Hadamard: ``2^-e`` with e = ceil(k/2) for ``side="v"`` and
    floor(k/2) for ``"o"`` (block = 2^k), so that ``e_v + e_o = k`` and the pair multiplies to exactly I."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1):
        raise ValueError(f"block: expected a power of two >= 1, got {block!r}")
    if side not in ("v", "o"):
        raise ValueError(f"side: expected 'v' or 'o', got {side!r}")
    k = block.bit_length() - 1
    return (k + 1) // 2 if side == "v" else k // 2


def _online(x: torch.Tensor, block: int, exponent: int) -> torch.Tensor:
    """``x`` times ``I ⊗ (±1 Sylvester matrix of block) · 2^-exponent`` over its last dim by the butterflies of each
    block, in float32 (float64 for float64 x), rounded once to x's dtype; x's layout kept: a BHND view of BNHD memory
    (what the processors hand the runtime) comes back as one."""
    d = x.shape[-1]
    if d % block:
        raise ValueError(f"x: head_dim {d} is not a multiple of the V/O Hadamard block {block}")
    bnhd = x.dim() == 4 and x.transpose(1, 2).is_contiguous() and not x.is_contiguous()
    y = x.transpose(1, 2) if bnhd else x
    lead = y.shape[:-1]
    z = _butterflies(y.to(_compute_dtype(x.dtype)).reshape(*lead, d // block, block)).reshape(*lead, d)
    z = (z * 2.0**-exponent).to(x.dtype)  # (an exact power of two: one rounding, in the cast)
    return z.transpose(1, 2) if bnhd else z


def rotate_v_online(v: torch.Tensor, block: int) -> torch.Tensor:
    """V's side of the online V/O Hadamard: ``v @ (I ⊗ H_block)`` up to the power-of-two scale
    ``2^-ceil(k/2) · sqrt(block)`` (block = 2^k) that :func:`unrotate_o_online` undoes exactly.

    ``v`` [..., D] (BHND, any layout), ``block`` a power of two dividing D (:func:`vo_hadamard_block`; 1 returns
    ``v``). Computed as the butterflies of :func:`fwht` on each block of D in float32 (float64 for float64 v), then
    the power of two, rounded once to v's dtype: the bits of the int8-fp8 CUDA pre-processing's fused rotation
    (``v_hadamard`` of :func:`rotvid.kernels.dispatch.prepare_attention`). Attention is linear in V, so
    ``unrotate_o_online(attention(q, k, rotate_v_online(v, b)), b)`` is ``attention(q, k, v)`` up to the rounding of
    the two transforms to v's dtype."""
    if block == 1:
        return v
    return _online(v, block, vo_hadamard_exponent(block, "v"))


def unrotate_o_online(o: torch.Tensor, block: int) -> torch.Tensor:
    """The output's side of the online V/O Hadamard (:func:`rotate_v_online`): ``o @ (I ⊗ H_block)`` times the
    power of two that makes the pair the identity, 2^-floor(k/2) times the ±1 matrix (the butterflies, as
    :func:`rotate_v_online`; the bits of :func:`rotvid.kernels.hadamard_op.vo_hadamard_cuda` with ``side="o"``)."""
    if block == 1:
        return o
    return _online(o, block, vo_hadamard_exponent(block, "o"))


def is_v_hadamard_fused(attn: nn.Module) -> bool:
    """True if :func:`fuse_v_hadamard` has been applied to ``attn`` (and not undone)."""
    return getattr(attn, FUSED_ATTR, None) is not None


def _check_plain_linear(name: str, module) -> None:
    """ValueError unless ``module`` is an ``nn.Linear`` (a LoRA / adapter wrapper is named by its full type)."""
    if not isinstance(module, nn.Linear):
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        hint = (" (an adapter layer, e.g. a LoRA: the fused V/O Hadamard rewrites plain weights only; "
                "vo_hadamard='online' rotates at run time and leaves every weight and adapter as it is)"
                if hasattr(module, "base_layer") else "")
        raise ValueError(f"{name} must be an nn.Linear for the fused V/O Hadamard, got {kind}{hint}")


def _value_targets(attn: nn.Module) -> list[tuple[str, nn.Linear, int, int]]:
    """(name, linear, first_row, end_row) of every value projection present on ``attn``."""
    targets = []
    for name, fused_parts in (
        ("to_v", 1),
        ("to_qkv", 3),
        ("to_kv", 2),
        ("add_v_proj", 1),
        ("to_added_qkv", 3),
        ("to_added_kv", 2),
    ):
        lin = getattr(attn, name, None)
        if lin is None:
            continue
        _check_plain_linear(f"attn.{name}", lin)
        out = lin.out_features
        if out % fused_parts:
            raise ValueError(f"attn.{name}.out_features={out} is not divisible by {fused_parts} (fused chunks)")
        size = out // fused_parts
        targets.append((name, lin, out - size, out))
    return targets


def _output_targets(attn: nn.Module, output_projection: nn.Linear | None, inner: int) -> list[tuple[str, nn.Linear, int, int]]:
    """(name, linear, first_col, end_col) of every projection reading the attention output."""
    targets = []
    to_out = getattr(attn, "to_out", None)
    if to_out is not None:
        if output_projection is not None:
            raise ValueError(
                "output_projection must be None when attn has its own to_out (it is only for attention "
                "modules built without to_out, e.g. HunyuanVideo single-stream blocks' proj_out)"
            )
        first = to_out[0] if isinstance(to_out, (nn.ModuleList, nn.Sequential)) else to_out
        _check_plain_linear("attn.to_out[0]", first)
        targets.append(("to_out[0]", first, 0, first.in_features))
    elif output_projection is None:
        raise ValueError(
            "attn has no to_out (e.g. HunyuanVideo single-stream attention, pre_only=True): pass "
            "output_projection=<the block's proj_out>, whose first inner_dim input columns read the "
            "attention output, or use fuse_v_hadamard_single_stream(block, head_dim)"
        )
    else:
        _check_plain_linear("output_projection", output_projection)
        if output_projection.in_features < inner:
            raise ValueError(
                f"output_projection.in_features={output_projection.in_features} < inner_dim={inner}: it "
                f"cannot read the attention output in its first inner_dim columns"
            )
        targets.append(("output_projection", output_projection, 0, inner))
    add_out = getattr(attn, "to_add_out", None)
    if add_out is not None:
        _check_plain_linear("attn.to_add_out", add_out)
        targets.append(("to_add_out", add_out, 0, add_out.in_features))
    return targets


@torch.no_grad()
def _rotated(attn: nn.Module, head_dim: int, output_projection: nn.Linear | None, *, inverse: bool,
             block: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(parameter, its rotated value)`` for every parameter the fusion rewrites (nothing is written)."""
    values = _value_targets(attn)
    if not values:
        raise ValueError("attn has no value projection (to_v / to_qkv / to_kv): not an attention module?")
    inner = values[0][3] - values[0][2]
    outputs = _output_targets(attn, output_projection, inner)
    widths = {name: stop - start for name, _, start, stop in values + outputs}
    if len(set(widths.values())) != 1:
        raise ValueError(f"value and output projections disagree on inner_dim: {widths}")
    if not isinstance(head_dim, int) or head_dim < 1 or inner % head_dim:
        raise ValueError(f"head_dim must be a positive int dividing inner_dim={inner}, got {head_dim!r}")
    heads = inner // head_dim
    if getattr(attn, "heads", heads) != heads:
        raise ValueError(f"head_dim={head_dim} gives {heads} heads but attn.heads={attn.heads}")
    if block is None:
        if head_dim & (head_dim - 1):
            raise ValueError(
                f"head_dim {head_dim} is not a power of two: the V/O Hadamard takes a block-diagonal one "
                f"(block={vo_hadamard_block(head_dim)}, the largest power of two dividing it), or set vo_hadamard=False"
            )
        block = head_dim
    h = block_hadamard_matrix(head_dim, block)
    # fuse: rows <- H^T W, columns <- W H;  unfuse: rows <- H W, columns <- W H^T.
    left_cpu = h if inverse else h.T
    right_cpu = h.T if inverse else h
    out = []
    for _, lin, r0, r1 in values:
        left = left_cpu.to(lin.weight.device)
        new = lin.weight.detach().clone()
        w = new[r0:r1].double().reshape(heads, head_dim, -1)
        new[r0:r1] = (left @ w).reshape(r1 - r0, -1).to(new.dtype)
        out.append((lin.weight, new))
        if lin.bias is not None:
            new_b = lin.bias.detach().clone()
            b = new_b[r0:r1].double().reshape(heads, head_dim, 1)
            new_b[r0:r1] = (left @ b).reshape(-1).to(new_b.dtype)
            out.append((lin.bias, new_b))
    for _, lin, c0, c1 in outputs:
        right = right_cpu.to(lin.weight.device)
        new = lin.weight.detach().clone()
        w = new[:, c0:c1].double().reshape(lin.out_features, heads, head_dim)
        new[:, c0:c1] = (w @ right).reshape(lin.out_features, -1).to(new.dtype)
        out.append((lin.weight, new))
    logger.debug(
        "%s V/O Hadamard (head_dim=%d, heads=%d, block=%d) on %s",
        "removed" if inverse else "fused",
        head_dim,
        heads,
        block,
        ", ".join(n for n, *_ in values + outputs),
    )
    return out


@torch.no_grad()
def _rotate(attn: nn.Module, head_dim: int, output_projection: nn.Linear | None, *, inverse: bool,
            block: int | None = None) -> None:
    for param, value in _rotated(attn, head_dim, output_projection, inverse=inverse, block=block):
        param.copy_(value)


def unfused_v_hadamard_values(attn: nn.Module, *, output_projection: nn.Linear | None = None
                              ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(parameter, value before the fusion)`` for every parameter :func:`fuse_v_hadamard` rewrote on ``attn``,
    computed without touching the module (up to rounding of the weights' dtype, as :func:`unfuse_v_hadamard`)."""
    state = getattr(attn, FUSED_ATTR, None)
    if state is None:
        raise ValueError("attn has no V/O Hadamard fused (nothing to undo)")
    return _rotated(attn, state["head_dim"], output_projection, inverse=True, block=state.get("block"))


def fuse_v_hadamard(attn: nn.Module, head_dim: int, *, output_projection: nn.Linear | None = None,
                    block: int | None = None) -> None:
    """Fuse a per-head normalized Hadamard into a diffusers attention module's V and O, in place.

    Rewrites (see the module docstring for the algebra) every value projection present —
    ``to_v``, the V slice (last third) of a fused ``to_qkv``, the V half of ``to_kv``,
    ``add_v_proj`` and the V slices of ``to_added_qkv`` / ``to_added_kv`` — and every output
    projection — ``to_out[0]`` and ``to_add_out`` (or ``output_projection``'s first inner_dim
    columns when the module has no ``to_out``). The module's output is unchanged up to rounding
    of the weights' dtype; arithmetic is done in float64.

    Args:
        attn: diffusers attention module (``WanAttention``, ``Attention`` of HunyuanVideo /
            CogVideoX blocks).
        head_dim: per-head dim D, a power of two (or any D with ``block``).
        output_projection: only for modules without ``to_out`` (HunyuanVideo single-stream:
            pass ``block.proj_out``).
        block: the Hadamard block: ``None`` (default) for H_D itself (D a power of two), or a power of two
            dividing D for the block-diagonal ``I ⊗ H_block`` (:func:`vo_hadamard_block`).

    Raises:
        ValueError: if already fused (the module records it), if the module lacks the layers
            above, or if head_dim does not match.
    """
    if is_v_hadamard_fused(attn):
        raise ValueError("attn already has the V/O Hadamard fused (fusing twice would not be the identity)")
    _rotate(attn, head_dim, output_projection, inverse=False, block=block)
    setattr(attn, FUSED_ATTR, {"head_dim": head_dim, "output_projection": output_projection is not None,
                               "block": head_dim if block is None else block})


def unfuse_v_hadamard(attn: nn.Module, head_dim: int, *, output_projection: nn.Linear | None = None) -> None:
    """Undo :func:`fuse_v_hadamard` in place (same arguments). Restores the weights up to
    rounding of their dtype. Raises ValueError if ``attn`` is not fused or the arguments differ
    from the ones it was fused with."""
    state = getattr(attn, FUSED_ATTR, None)
    if state is None:
        raise ValueError("attn has no V/O Hadamard fused (nothing to undo)")
    if state["head_dim"] != head_dim or state["output_projection"] != (output_projection is not None):
        raise ValueError(
            f"unfuse_v_hadamard arguments differ from the fusion: fused with head_dim={state['head_dim']}, "
            f"output_projection given={state['output_projection']}; got head_dim={head_dim}, "
            f"output_projection given={output_projection is not None}"
        )
    _rotate(attn, head_dim, output_projection, inverse=True, block=state.get("block", head_dim))
    attn.__dict__.pop(FUSED_ATTR, None)  # the module as before the fusion (no attribute left behind)


def _single_stream_parts(block: nn.Module) -> tuple[nn.Module, nn.Linear]:
    attn = getattr(block, "attn", None)
    proj_out = getattr(block, "proj_out", None)
    if attn is None or not isinstance(proj_out, nn.Linear) or getattr(attn, "to_out", None) is not None:
        raise ValueError(
            "block must be a HunyuanVideo single-stream block: .attn without to_out and an nn.Linear "
            f".proj_out; got {type(block).__name__}"
        )
    return attn, proj_out


def fuse_v_hadamard_single_stream(block: nn.Module, head_dim: int) -> None:
    """:func:`fuse_v_hadamard` for a HunyuanVideo single-stream block
    (``HunyuanVideoSingleTransformerBlock`` / ``HunyuanVideoTokenReplaceSingleTransformerBlock``):
    H on ``block.attn.to_v``, H^T on the first inner_dim columns of ``block.proj_out``.
    The fusion is recorded on ``block.attn``."""
    attn, proj_out = _single_stream_parts(block)
    fuse_v_hadamard(attn, head_dim, output_projection=proj_out)


def unfuse_v_hadamard_single_stream(block: nn.Module, head_dim: int) -> None:
    """Undo :func:`fuse_v_hadamard_single_stream`."""
    attn, proj_out = _single_stream_parts(block)
    unfuse_v_hadamard(attn, head_dim, output_projection=proj_out)
