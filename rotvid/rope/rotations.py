"""Rotations of Q and K after RoPE: none, interleaved, half, full (Hadamard), learned.

Every rotation R is an orthogonal D×D matrix applied to rows: ``apply(x) = x @ R`` for x
[..., D]. Applied to both Q and K it leaves the scores unchanged,
(QR)(KR)^T = QK^T, while spreading the outliers 3D RoPE leaves in some channels.

Pair rotations (RotateAttention §4.1) are block-diagonal up to a permutation: a list of
disjoint channel pairs (a, b), a < b, each rotated by a 2×2 block B ∈ O(2)::

    [y_a, y_b] = [x_a, x_b] @ B        (all other pairs likewise)

* ``interleaved``: pairs (2i, 2i+1) — the same pairs RoPE rotates, so it fuses into the RoPE
  table at zero cost.
* ``half``: within each RoPE segment j (offset o_j, size D_j), pairs (o_j + i, o_j + i + D_j/2),
  i < D_j/2 (D_j/2 may be odd, e.g. Wan's 44/42/42).
* ``learned``: either pairing, one block per pair from an angle and a reflection bit.

Default blocks are H_2 = [[1, 1], [1, -1]] / sqrt(2) (the paper's initialization).
Learned blocks (see :func:`pair_blocks`): angle θ, reflect r ∈ {0, 1}::

    r = 0 (rotation):   B = [[cos θ,  sin θ], [-sin θ, cos θ]]
    r = 1 (reflection): B = [[cos θ,  sin θ], [ sin θ, -cos θ]]      (H_2 is θ = π/4, r = 1)

Learned rotation files (safetensors): tensors ``angles`` float [P] (or [blocks, P] or
[blocks, heads, P]) with P = D/2 pairs in pair order (interleaved: pair i = (2i, 2i+1); half:
segment by segment, i ascending), ``reflect`` int8 of the same shape, metadata
``{"pairing": "interleaved" | "half", "head_dim": "128", "segments": "44,42,42"}``.
Leading dims are selected with :meth:`PairRotation.select` (e.g. the block index); a remaining
head dim applies per head to x [..., H, N, D] (BHND).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import safe_open

from rotvid.rope.hadamard import fwht, hadamard_matrix

__all__ = [
    "Rotation",
    "NoRotation",
    "PairRotation",
    "FullHadamardRotation",
    "make_rotation",
    "interleaved_pairs",
    "half_rotation_pairs",
    "pair_blocks",
    "h2_blocks",
    "save_learned_rotation",
    "load_learned_rotation",
    "ROTATION_KINDS",
]

logger = logging.getLogger(__name__)

ROTATION_KINDS = ("none", "interleaved", "half", "full", "learned")
PAIRINGS = ("interleaved", "half")
JSON_VERSION = 1


def _check_head_dim(head_dim: int) -> int:
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}")
    return head_dim


def _check_segments(segments: Sequence[int] | None, head_dim: int) -> tuple[int, ...]:
    if segments is None:
        return (head_dim,)
    try:
        segs = tuple(int(s) for s in segments)
    except (TypeError, ValueError):
        raise ValueError(f"segments must be a sequence of ints, got {segments!r}") from None
    if not segs or sum(segs) != head_dim or any(s <= 0 or s % 2 for s in segs):
        raise ValueError(f"segments must be positive even ints summing to head_dim={head_dim}, got {segments!r}")
    return segs


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def interleaved_pairs(head_dim: int) -> torch.Tensor:
    """Pairs (2i, 2i+1), i < D/2, as long [D/2, 2]."""
    _check_head_dim(head_dim)
    return torch.arange(head_dim).reshape(-1, 2)


def half_rotation_pairs(segments: Sequence[int]) -> torch.Tensor:
    """Half-rotation pairs (o_j + i, o_j + i + D_j/2) of every segment j, as long [D/2, 2].

    Segments in order (t, h, w); each D_j even (D_j/2 may be odd).
    """
    segs = _check_segments(segments, sum(int(s) for s in segments))
    pairs, offset = [], 0
    for size in segs:
        half = size // 2
        first = torch.arange(offset, offset + half)
        pairs.append(torch.stack([first, first + half], dim=1))
        offset += size
    return torch.cat(pairs, dim=0)


def pair_blocks(angles: torch.Tensor, reflect: torch.Tensor) -> torch.Tensor:
    """2×2 O(2) blocks from angles θ and reflection bits r (see the module docstring).

    angles: float [..., P]; reflect: int/bool [..., P] with values in {0, 1}.
    Returns float64 [..., P, 2, 2].
    """
    if angles.shape != reflect.shape:
        raise ValueError(f"angles and reflect must have the same shape, got {tuple(angles.shape)} and {tuple(reflect.shape)}")
    r = reflect.to(torch.int64)
    if not bool(((r == 0) | (r == 1)).all()):
        raise ValueError("reflect must hold only 0 and 1")
    a = angles.to(torch.float64)
    c, s = torch.cos(a), torch.sin(a)
    sign = 1.0 - 2.0 * r.to(torch.float64)  # +1 rotation, -1 reflection
    row0 = torch.stack([c, s], dim=-1)
    row1 = torch.stack([-s * sign, c * sign], dim=-1)
    return torch.stack([row0, row1], dim=-2)


def h2_blocks(num_pairs: int) -> torch.Tensor:
    """num_pairs copies of H_2 = [[1, 1], [1, -1]]/sqrt(2), exactly, float64 [P, 2, 2]."""
    v = math.sqrt(0.5)
    return torch.tensor([[v, v], [v, -v]], dtype=torch.float64).expand(num_pairs, 2, 2).clone()


class Rotation:
    """Base class: an orthogonal D×D rotation applied to rows of Q and K after RoPE.

    Attributes:
        kind: one of ``ROTATION_KINDS``.
        head_dim: D.
    """

    kind: str = ""
    head_dim: int = 0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] -> x @ R, same shape and dtype (computed in float32, or float64 for
        float64 x)."""
        raise NotImplementedError

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """R as a dense [D, D] tensor (or [*lead, D, D] for per-head learned rotations)."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """JSON-serializable description; :meth:`Rotation.from_json` rebuilds it."""
        raise NotImplementedError

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Rotation":
        """Rebuild a rotation from :meth:`to_json` output."""
        if not isinstance(d, dict) or d.get("kind") not in ROTATION_KINDS:
            raise ValueError(f"d must be a dict with 'kind' in {ROTATION_KINDS}, got {d!r}")
        version = d.get("version", JSON_VERSION)
        if version != JSON_VERSION:
            raise ValueError(f"rotation JSON version must be {JSON_VERSION}, got {version!r}")
        kind, head_dim = d["kind"], d.get("head_dim")
        if kind == "none":
            return NoRotation(head_dim)
        if kind == "full":
            return FullHadamardRotation(head_dim)
        if kind == "interleaved":
            return PairRotation.interleaved(head_dim)
        if kind == "half":
            return PairRotation.half(head_dim, d.get("segments"))
        # learned
        if d.get("path") is not None:
            rot = load_learned_rotation(d["path"], head_dim, d.get("segments"))
            for index in d.get("select", []):
                rot = rot.select(index)
            return rot
        if "angles" not in d or "reflect" not in d:
            raise ValueError("learned rotation JSON needs 'path' or inline 'angles' and 'reflect'")
        return PairRotation.learned(
            torch.tensor(d["angles"], dtype=torch.float64),
            torch.tensor(d["reflect"], dtype=torch.int8),
            pairing=d.get("pairing"),
            head_dim=head_dim,
            segments=d.get("segments"),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, head_dim={self.head_dim})"

    def _device_cache(self) -> dict:
        """Per-(device, dtype) operands of :meth:`apply`, created on first use.

        Under torch.compile a fresh dict per trace: the operands become constants of the graph, and no
        guard watches a dict the trace itself filled (torch 2.11 would recompile on it once)."""
        if torch.compiler.is_compiling():
            return {}
        cache = getattr(self, "_device_tensors", None)
        if cache is None:
            cache = {}
            self._device_tensors = cache
        return cache


class NoRotation(Rotation):
    """R = I."""

    kind = "none"

    def __init__(self, head_dim: int):
        self.head_dim = _check_head_dim(head_dim)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [..., {self.head_dim}], got {tuple(x.shape)}")
        return x

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return torch.eye(self.head_dim, dtype=dtype)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "none", "head_dim": self.head_dim, "version": JSON_VERSION}


class FullHadamardRotation(Rotation):
    """R = H_D, the normalized D×D Sylvester Hadamard (D a power of two), applied after RoPE by the fast
    Walsh–Hadamard transform (:func:`rotvid.rope.hadamard.fwht`: log2 D butterfly stages, its order defines the
    bits). Not a pair rotation: the generalized table carries it as a flag (``GeneralizedRopeTable.hadamard``),
    and the CUDA kernels run the transform in registers after the table."""

    kind = "full"

    def __init__(self, head_dim: int):
        self.head_dim = _check_head_dim(head_dim)
        if head_dim & (head_dim - 1):
            raise ValueError(f"head_dim must be a power of two for the full Hadamard rotation, got {head_dim}")

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [..., {self.head_dim}], got {tuple(x.shape)}")
        return fwht(x)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return hadamard_matrix(self.head_dim, dtype)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "full", "head_dim": self.head_dim, "version": JSON_VERSION}


class PairRotation(Rotation):
    """A rotation made of 2×2 O(2) blocks on disjoint channel pairs.

    Attributes:
        kind: ``"interleaved"``, ``"half"`` (H_2 blocks) or ``"learned"``.
        pairing: ``"interleaved"`` or ``"half"``.
        segments: RoPE segment sizes used by the half pairing (``(D,)`` if one segment).
        pairs: long [P, 2], P = D/2, each row (a, b) with a < b; together a partition of 0..D-1.
        blocks: float64 [*lead, P, 2, 2]; lead is () or e.g. (heads,) / (blocks, heads).
        angles, reflect: the learned parameters ([*lead, P]) for kind "learned", else None.
        source: path of the file a learned rotation was loaded from (None otherwise).

    Treat instances as immutable: ``apply`` caches the per-channel structure per device/dtype.
    """

    def __init__(
        self,
        kind: str,
        pairing: str,
        head_dim: int,
        segments: Sequence[int] | None,
        blocks: torch.Tensor,
        *,
        angles: torch.Tensor | None = None,
        reflect: torch.Tensor | None = None,
        source: str | None = None,
        selected: tuple[int, ...] = (),
    ):
        if kind not in ("interleaved", "half", "learned"):
            raise ValueError(f"kind must be 'interleaved', 'half' or 'learned', got {kind!r}")
        if pairing not in PAIRINGS:
            raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
        self.kind = kind
        self.pairing = pairing
        self.head_dim = _check_head_dim(head_dim)
        self.segments = _check_segments(segments, head_dim)
        self.pairs = interleaved_pairs(head_dim) if pairing == "interleaved" else half_rotation_pairs(self.segments)
        num_pairs = head_dim // 2
        if blocks.dim() < 3 or blocks.shape[-3:] != (num_pairs, 2, 2):
            raise ValueError(f"blocks must be [..., {num_pairs}, 2, 2], got {tuple(blocks.shape)}")
        self.blocks = blocks.to(torch.float64)
        self.angles = angles
        self.reflect = reflect
        self.source = source
        self.selected = tuple(selected)

    # --- constructors -----------------------------------------------------------------------
    @classmethod
    def interleaved(cls, head_dim: int) -> "PairRotation":
        """H_2 on every pair (2i, 2i+1)."""
        return cls("interleaved", "interleaved", head_dim, None, h2_blocks(_check_head_dim(head_dim) // 2))

    @classmethod
    def half(cls, head_dim: int, segments: Sequence[int] | None = None) -> "PairRotation":
        """H_2 on every half-rotation pair of each segment (segments None: one segment)."""
        return cls("half", "half", head_dim, segments, h2_blocks(_check_head_dim(head_dim) // 2))

    @classmethod
    def learned(
        cls,
        angles: torch.Tensor,
        reflect: torch.Tensor,
        *,
        pairing: str,
        head_dim: int,
        segments: Sequence[int] | None = None,
        source: str | None = None,
    ) -> "PairRotation":
        """Learned blocks from angles [*lead, D/2] and reflection bits [*lead, D/2]."""
        _check_head_dim(head_dim)
        if angles.dim() < 1 or angles.shape[-1] != head_dim // 2:
            raise ValueError(f"angles must be [..., {head_dim // 2}] (one per pair), got {tuple(angles.shape)}")
        return cls(
            "learned",
            pairing,
            head_dim,
            segments,
            pair_blocks(angles, reflect),
            angles=angles.detach().to(torch.float64).clone(),
            reflect=reflect.detach().to(torch.int8).clone(),
            source=source,
        )

    # --- structure -----------------------------------------------------------------------------
    @property
    def lead_shape(self) -> tuple[int, ...]:
        """Leading dims of ``blocks`` (() for one rotation shared by all heads)."""
        return tuple(self.blocks.shape[:-3])

    def select(self, index: int) -> "PairRotation":
        """The rotation at ``index`` of the first leading dim (e.g. the block of a
        [blocks, heads, P] learned file)."""
        if not self.lead_shape:
            raise ValueError("select() needs a rotation with leading dims (e.g. [blocks, P] angles)")
        n = self.lead_shape[0]
        if not isinstance(index, int) or not -n <= index < n:
            raise ValueError(f"index must be an int in [{-n}, {n}), got {index!r}")
        return PairRotation(
            self.kind,
            self.pairing,
            self.head_dim,
            self.segments,
            self.blocks[index],
            angles=None if self.angles is None else self.angles[index],
            reflect=None if self.reflect is None else self.reflect[index],
            source=self.source,
            selected=self.selected + (index % n,),
        )

    def column_structure(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per output channel c: its partner p(c), R[c, c] and R[p(c), c].

        Returns (partner long [D], diag float64 [*lead, D], off float64 [*lead, D]), so that
        ``(x @ R)[c] = diag[c] * x[c] + off[c] * x[partner[c]]``.
        """
        a, b = self.pairs[:, 0], self.pairs[:, 1]
        d = self.head_dim
        partner = torch.empty(d, dtype=torch.long)
        partner[a], partner[b] = b, a
        diag = torch.empty(*self.lead_shape, d, dtype=torch.float64)
        off = torch.empty_like(diag)
        blk = self.blocks
        diag[..., a], diag[..., b] = blk[..., 0, 0], blk[..., 1, 1]
        off[..., a], off[..., b] = blk[..., 1, 0], blk[..., 0, 1]
        return partner, diag, off

    # --- Rotation API --------------------------------------------------------------------------
    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x @ R for x [..., D]; with per-head blocks [H, P, 2, 2], x must be [..., H, N, D]."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [..., {self.head_dim}], got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"x: expected a floating-point tensor, got {x.dtype} (the rotation would be truncated)")
        lead = self.lead_shape
        if lead and (x.dim() < len(lead) + 2 or tuple(x.shape[-2 - len(lead) : -2]) != lead):
            raise ValueError(
                f"this rotation has per-{lead} blocks: x must be [..., {', '.join(map(str, lead))}, N, D], "
                f"got {tuple(x.shape)} (use .select() for a block index)"
            )
        cd = _compute_dtype(x)
        key = (x.device, cd)
        cache = self._device_cache()
        if key not in cache:
            partner, diag, off = self.column_structure()
            # diag/off [*lead, D] -> [*lead, 1, D] to broadcast over the token axis.
            cache[key] = (
                partner.to(x.device),
                diag.to(device=x.device, dtype=cd).unsqueeze(-2),
                off.to(device=x.device, dtype=cd).unsqueeze(-2),
            )
        partner, diag, off = cache[key]
        xc = x.to(cd)
        return (xc * diag + xc[..., partner] * off).to(x.dtype)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        partner, diag, off = self.column_structure()
        d = self.head_dim
        r = torch.zeros(*self.lead_shape, d, d, dtype=torch.float64)
        cols = torch.arange(d)
        r[..., cols, cols] = diag
        r[..., partner, cols] = off
        return r.to(dtype)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "head_dim": self.head_dim, "version": JSON_VERSION}
        if self.pairing == "half":
            out["segments"] = list(self.segments)
        if self.kind != "learned":
            return out
        out["pairing"] = self.pairing
        out["segments"] = list(self.segments)
        if self.source is not None:
            out["path"] = self.source
            if self.selected:
                out["select"] = list(self.selected)
        else:
            out["angles"] = self.angles.tolist()
            out["reflect"] = self.reflect.to(torch.int64).tolist()
        return out


def save_learned_rotation(
    path: str | Path,
    angles: torch.Tensor,
    reflect: torch.Tensor,
    *,
    pairing: str,
    head_dim: int,
    segments: Sequence[int] | None = None,
) -> None:
    """Write a learned rotation file (format in the module docstring).

    angles: float [P] / [blocks, P] / [blocks, heads, P] (P = head_dim/2); reflect: same shape,
    values in {0, 1}.
    """
    rot = PairRotation.learned(angles, reflect, pairing=pairing, head_dim=head_dim, segments=segments)
    if rot.angles.dim() > 3:
        raise ValueError(f"angles must be [P], [blocks, P] or [blocks, heads, P], got {tuple(angles.shape)}")
    from rotvid.rope.dumps import save_safetensors_atomically

    save_safetensors_atomically(
        {"angles": rot.angles.float().contiguous(), "reflect": rot.reflect.contiguous()},
        Path(path),
        {"pairing": pairing, "head_dim": str(head_dim), "segments": ",".join(map(str, rot.segments))},
    )


def load_learned_rotation(path: str | Path, head_dim: int, segments: Sequence[int] | None = None) -> PairRotation:
    """Read a learned rotation file. ``head_dim`` must match the file; ``segments`` (if given)
    must match the file's for the half pairing."""
    path = str(path)
    if not Path(path).is_file():
        raise ValueError(f"path must be an existing learned-rotation .safetensors file, got {path!r}")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        names = set(f.keys())
        if not {"angles", "reflect"} <= names:
            raise ValueError(f"{path}: learned rotation file must hold tensors 'angles' and 'reflect', has {sorted(names)}")
        angles, reflect = f.get_tensor("angles"), f.get_tensor("reflect")
    for key in ("pairing", "head_dim"):
        if key not in meta:
            raise ValueError(f"{path}: metadata must have {key!r} (has {sorted(meta)})")
    if int(meta["head_dim"]) != head_dim:
        raise ValueError(f"{path}: file is for head_dim={meta['head_dim']}, asked for head_dim={head_dim}")
    file_segments = tuple(int(s) for s in meta["segments"].split(",")) if meta.get("segments") else None
    if segments is not None and file_segments is not None and meta["pairing"] == "half":
        if tuple(int(s) for s in segments) != file_segments:
            raise ValueError(f"{path}: file has segments {file_segments}, asked for {tuple(segments)}")
    return PairRotation.learned(
        angles,
        reflect,
        pairing=meta["pairing"],
        head_dim=head_dim,
        segments=file_segments if file_segments is not None else segments,
        source=path,
    )


def make_rotation(spec: str, head_dim: int, segments: Sequence[int] | None = None) -> Rotation:
    """Build a rotation from a spec string.

    Args:
        spec: ``"none"``, ``"interleaved"``, ``"half"``, ``"full"`` or
            ``"learned:<path.safetensors>"``.
        head_dim: D.
        segments: RoPE segment sizes (t, h, w), needed by ``"half"``; None = one segment of D.
    """
    if not isinstance(spec, str):
        raise ValueError(f"spec must be a string, got {spec!r}")
    if spec == "none":
        return NoRotation(head_dim)
    if spec == "interleaved":
        return PairRotation.interleaved(head_dim)
    if spec == "half":
        return PairRotation.half(head_dim, segments)
    if spec == "full":
        return FullHadamardRotation(head_dim)
    if spec.startswith("learned:") and len(spec) > len("learned:"):
        return load_learned_rotation(spec[len("learned:") :], head_dim, segments)
    raise ValueError(
        f"spec must be 'none', 'interleaved', 'half', 'full' or 'learned:<path.safetensors>', got {spec!r}"
    )
