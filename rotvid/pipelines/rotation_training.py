"""Learning RoPE-aware 2×2 rotations (paper §4.1, Eq. 9–10) on captured Q/K.

A learned rotation is block-diagonal up to a channel pairing: channel pairs ``(i, j)`` (the
*interleaved* pairing (2p, 2p+1), or the *half* pairing (c, c + D_j/2) inside each RoPE
segment) each get a 2×2 orthogonal block, applied as ``x @ R`` on row vectors:

    rotation   (reflect = 0):  [[cos θ,  sin θ], [-sin θ,  cos θ]]
    reflection (reflect = 1):  [[cos θ,  sin θ], [ sin θ, -cos θ]]

so the paper's initialization H₂ = [[1, 1], [1, -1]]/√2 is (θ = π/4, reflect = 1). The angle is
trained, the reflection bit stays fixed: every block stays in O(2) exactly, whatever the
optimizer does.

Objective (Eq. 9): ``‖Y − Q(Q_s R) Q(K_s R)ᵀ‖²_F / ‖Y‖²_F`` with ``Y = Q_s K_sᵀ`` and Q(·) the
per-token INT4 quantizer, differentiated with a straight-through estimator (Adam).
``unconstrained=True`` learns general invertible 2×2 blocks A (Q gets A, K gets A^{-T}) — the
paper's ablation: exact in full precision, but not orthogonal.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from rotvid.kernels.fake_quant import fake_quant_attention, fake_quant_per_token_int4
from rotvid.rope.rotations import PairRotation, half_rotation_pairs, interleaved_pairs, pair_blocks

logger = logging.getLogger(__name__)


def blocks_to_matrix(blocks: torch.Tensor, pairs: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Scatter 2×2 blocks [..., P, 2, 2] on channel pairs [P, 2] into D×D matrices [..., D, D]."""
    lead = blocks.shape[:-3]
    mat = blocks.new_zeros(*lead, head_dim, head_dim)
    i, j = pairs[:, 0], pairs[:, 1]
    mat[..., i, i] = blocks[..., 0, 0]
    mat[..., i, j] = blocks[..., 0, 1]
    mat[..., j, i] = blocks[..., 1, 0]
    mat[..., j, j] = blocks[..., 1, 1]
    return mat


def rotation_objective(q: torch.Tensor, k: torch.Tensor, r_q: torch.Tensor, r_k: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 9 normalized: ``‖Y − Q(q R_q) Q(k R_k)ᵀ‖² / ‖Y‖²`` with ``Y = q kᵀ`` (per head, summed).

    ``q`` [..., N_q, D] and ``k`` [..., N_kv, D] are smoothed; ``r_q`` [..., D, D]; ``r_k``
    defaults to ``r_q`` (orthogonal case).
    """
    r_k = r_q if r_k is None else r_k
    y = q @ k.transpose(-1, -2)
    y_hat = fake_quant_per_token_int4(q @ r_q) @ fake_quant_per_token_int4(k @ r_k).transpose(-1, -2)
    return (y - y_hat).square().sum() / y.square().sum()


def output_objective(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r_q: torch.Tensor, r_k: torch.Tensor | None = None,
    *, block_n: int = 64,
) -> torch.Tensor:
    """End-to-end objective: ``‖O − O_int4(q R_q, k R_k, v)‖² / ‖O‖²`` with the full INT4 recipe
    (fake-quantized Q/K/V and range-optimized P, :func:`fake_quant_attention`), O in full precision."""
    r_k = r_q if r_k is None else r_k
    with torch.no_grad():
        ref = fake_quant_attention(q, k, v, p_mode=None, quantize_qkv=False)
    out = fake_quant_attention(q @ r_q, k @ r_k, v, p_mode="range", block_n=block_n)
    return (out - ref).square().sum() / ref.square().sum()


@dataclass
class LearnedRotationResult:
    """What training produced: angles/reflect (orthogonal) or raw blocks (unconstrained)."""

    pairs: torch.Tensor
    head_dim: int
    pairing: str
    angles: torch.Tensor | None = None
    reflect: torch.Tensor | None = None
    blocks: torch.Tensor | None = None
    objective_init: float = math.nan
    objective_final: float = math.nan
    history: list[float] = field(default_factory=list)

    def matrix_q(self) -> torch.Tensor:
        """R applied to Q: [..., D, D] (float64)."""
        blocks = pair_blocks(self.angles, self.reflect.expand_as(self.angles)) if self.blocks is None else self.blocks.double()
        return blocks_to_matrix(blocks, self.pairs, self.head_dim)

    def matrix_k(self) -> torch.Tensor:
        """R applied to K: R itself (orthogonal) or A^{-T} (unconstrained)."""
        r = self.matrix_q()
        return r if self.blocks is None else torch.linalg.inv(r).transpose(-1, -2)

    def to_rotation(self, segments: tuple[int, ...] | None = None) -> PairRotation:
        """The learned (orthogonal) rotation as a :class:`PairRotation` (``make_rotation`` loads its file)."""
        if self.blocks is not None:
            raise ValueError("unconstrained blocks are not a rotation: they are kept as an ablation only")
        return PairRotation.learned(
            self.angles.detach(), self.reflect, pairing=self.pairing, head_dim=self.head_dim, segments=segments
        )


def learn_rotation(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    pairing: str = "interleaved",
    segments: tuple[int, ...] | None = None,
    per_head: bool = False,
    iters: int = 200,
    lr: float = 0.01,
    unconstrained: bool = False,
    seed: int = 0,
    v: torch.Tensor | None = None,
    objective: str = "scores",
) -> LearnedRotationResult:
    """Learn 2×2 blocks on smoothed ``q``, ``k`` [H, N, D] (or [N, D]) minimizing Eq. 9.

    Args:
        pairing: ``"interleaved"`` or ``"half"`` (needs ``segments``, the RoPE segment sizes).
        per_head: one set of blocks per head (angles [H, P]) instead of one shared set.
        iters, lr: Adam iterations and learning rate.
        unconstrained: learn general 2×2 blocks (init H₂); K gets the inverse transpose.
        objective: ``"scores"`` (Eq. 9) or ``"output"`` (attention output error of the full
            INT4 recipe through the fake-quantized attention; needs ``v`` [H, N_kv, D], with
            ``k`` and ``v`` holding the same keys).
    """
    if q.dim() == 2:
        q, k = q.unsqueeze(0), k.unsqueeze(0)
    if q.dim() != 3 or k.dim() != 3 or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ValueError(f"q, k: expected [H, N, D] tensors with equal H and D, got {tuple(q.shape)} and {tuple(k.shape)}")
    head_dim = q.shape[-1]
    if objective not in ("scores", "output"):
        raise ValueError(f"objective: expected 'scores' or 'output', got {objective!r}")
    if objective == "output":
        if v is None:
            raise ValueError("v: the 'output' objective needs the values (same keys as k)")
        v = v.unsqueeze(0) if v.dim() == 2 else v
        if v.shape != k.shape:
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
        v = v.float()
        loss_fn = lambda a, b, rq, rk: output_objective(a, b, v, rq, rk)  # noqa: E731
    else:
        loss_fn = rotation_objective
    if pairing == "interleaved":
        pairs = interleaved_pairs(head_dim)
    elif pairing == "half":
        if not segments:
            raise ValueError("segments: the 'half' pairing pairs channels within each RoPE segment; pass the segment "
                             "sizes (e.g. (44, 42, 42) for Wan at head_dim 128)")
        pairs = half_rotation_pairs(tuple(segments))
    else:
        raise ValueError(f"pairing: expected 'interleaved' or 'half', got {pairing!r}")
    torch.manual_seed(seed)
    q, k = q.float(), k.float()
    n_pairs = pairs.shape[0]
    lead = (q.shape[0],) if per_head else ()
    reflect = torch.ones(*lead, n_pairs, dtype=torch.int8)
    if unconstrained:
        h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]]) / math.sqrt(2)
        param = h2.expand(*lead, n_pairs, 2, 2).clone().requires_grad_(True)
    else:
        param = torch.full((*lead, n_pairs), math.pi / 4).requires_grad_(True)

    def matrices():
        blocks = param if unconstrained else pair_blocks(param, reflect).float()
        r_q = blocks_to_matrix(blocks, pairs, head_dim)
        r_k = torch.linalg.inv(r_q).transpose(-1, -2) if unconstrained else r_q
        if per_head:
            return r_q, r_k
        return r_q.unsqueeze(0), r_k.unsqueeze(0)

    opt = torch.optim.Adam([param], lr=lr)
    history = []
    with torch.no_grad():
        init = float(loss_fn(q, k, *matrices()))
    best, best_param = init, param.detach().clone()
    for step in range(iters + 1):
        opt.zero_grad()
        loss = loss_fn(q, k, *matrices())
        now = float(loss.detach())
        history.append(now)
        if now < best:  # the objective at the parameters before this step
            best, best_param = now, param.detach().clone()
        if step < iters:
            loss.backward()
            opt.step()
    logger.info("rotation objective %.6g -> %.6g (%s, %d iters)", init, best, pairing, iters)
    result = LearnedRotationResult(
        pairs=pairs, head_dim=head_dim, pairing=pairing, objective_init=init, objective_final=best, history=history
    )
    if unconstrained:
        result.blocks = best_param
    else:
        result.angles, result.reflect = best_param, reflect
    return result
