"""Save and load Q/K/V captured from a real model run, for the accuracy study.

A dump is one ``.safetensors`` file with tensors ``q``, ``k``, ``v`` and string metadata:

================  =================================================================
``format``        ``"rotvid.qkv_dump/1"``
``model``         model id or path (e.g. ``"Wan-AI/Wan2.1-T2V-1.3B-Diffusers"``)
``family``        RoPE family (``"wan"``, ``"hunyuan_video"``, ``"cogvideox"``)
``block``         transformer block index
``step``          denoising step index
``grid``          token grid ``"f,h,w"`` of the video tokens
``layout``        ``"BHND"`` or ``"BNHD"``
``text_tokens``   number of text tokens in the sequence (0 for Wan self-attention)
``text_position`` ``"none"``, ``"first"`` (CogVideoX) or ``"last"`` (HunyuanVideo)
``stage``         ``"post_rope"``: q and k exactly as the attention receives them (RoPE
                  applied, no rotation, no smoothing); v as projected
``kv_len``        optional: number of valid keys (HunyuanVideo pads the text; keys
                  ``>= kv_len`` are masked), absent when every key is valid
================  =================================================================

Any extra string metadata given at save time is kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rotvid.rope.model_facts import rope_facts

__all__ = ["QKVDump", "save_qkv_dump", "load_qkv_dump", "DUMP_FORMAT"]

DUMP_FORMAT = "rotvid.qkv_dump/1"
_LAYOUTS = ("BHND", "BNHD")
_TEXT_POSITIONS = ("none", "first", "last")
_RESERVED = (
    "format", "model", "family", "block", "step", "grid", "layout", "text_tokens", "text_position", "stage", "kv_len",
)


@dataclass
class QKVDump:
    """Q/K/V of one attention call of a real model run.

    Attributes:
        q, k, v: [B, H, N, D] or [B, N, H, D] per ``layout``, the dtype they were saved in.
        model, family, block, step, grid, layout, text_tokens, text_position, kv_len: see the
            module docstring (kv_len None: every key valid).
        extra: any other metadata (str -> str).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    model: str
    family: str
    block: int
    step: int
    grid: tuple[int, int, int]
    layout: str = "BHND"
    text_tokens: int = 0
    text_position: str = "none"
    kv_len: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def bhnd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) as [B, H, N, D]."""
        if self.layout == "BHND":
            return self.q, self.k, self.v
        return self.q.transpose(1, 2), self.k.transpose(1, 2), self.v.transpose(1, 2)

    def video_slice(self) -> slice:
        """Token slice of the video tokens (the RoPE-carrying part) along N."""
        n_video = self.grid[0] * self.grid[1] * self.grid[2]
        start = self.text_tokens if self.text_position == "first" else 0
        return slice(start, start + n_video)


def _validate(d: QKVDump) -> None:
    if d.layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {d.layout!r}")
    known = rope_facts()
    if d.family not in known:
        raise ValueError(f"family must be one of {sorted(known)}, got {d.family!r}")
    if d.text_position not in _TEXT_POSITIONS:
        raise ValueError(f"text_position must be one of {_TEXT_POSITIONS}, got {d.text_position!r}")
    if (d.text_tokens == 0) != (d.text_position == "none"):
        raise ValueError(f"text_tokens={d.text_tokens} and text_position={d.text_position!r} disagree")
    if len(d.grid) != 3 or any(int(g) < 1 for g in d.grid):
        raise ValueError(f"grid must be three positive ints (f, h, w), got {d.grid!r}")
    for name in ("q", "k", "v"):
        t = getattr(d, name)
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor ({d.layout}), got {getattr(t, 'shape', t)!r}")
    q, k, v = d.bhnd()
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v shapes disagree: {tuple(d.q.shape)}, {tuple(d.k.shape)}, {tuple(d.v.shape)}")
    n_expected = d.grid[0] * d.grid[1] * d.grid[2] + d.text_tokens
    if q.shape[2] != n_expected or k.shape[2] != n_expected:
        raise ValueError(
            f"grid {tuple(d.grid)} + text_tokens={d.text_tokens} gives N={n_expected}, "
            f"but q has N={q.shape[2]} and k has N={k.shape[2]} ({d.layout})"
        )
    if d.kv_len is not None and not 1 <= d.kv_len <= n_expected:
        raise ValueError(f"kv_len must be in [1, {n_expected}] or None, got {d.kv_len!r}")


def save_qkv_dump(
    path: str | Path,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    model: str,
    family: str,
    block: int,
    step: int,
    grid: tuple[int, int, int],
    layout: str = "BHND",
    text_tokens: int = 0,
    text_position: str = "none",
    kv_len: int | None = None,
    extra_metadata: dict[str, str] | None = None,
) -> None:
    """Write q, k (post-RoPE, un-rotated) and v of one attention call to ``path``.

    Shapes: [B, H, N, D] or [B, N, H, D] per ``layout``, N = f*h*w + text_tokens; any float
    dtype (kept as is). kv_len: valid keys when the model masks padded keys (None: all valid).
    Tensors are moved to CPU and made contiguous.
    """
    extra = dict(extra_metadata or {})
    clash = set(extra) & set(_RESERVED)
    if clash:
        raise ValueError(f"extra_metadata must not use reserved keys {sorted(clash)}")
    if not all(isinstance(a, str) and isinstance(b, str) for a, b in extra.items()):
        raise ValueError("extra_metadata must map str to str")
    dump = QKVDump(
        q, k, v, model=str(model), family=family, block=int(block), step=int(step),
        grid=tuple(int(g) for g in grid), layout=layout, text_tokens=int(text_tokens),
        text_position=text_position, kv_len=None if kv_len is None else int(kv_len), extra=extra,
    )  # fmt: skip
    _validate(dump)
    meta = {
        "format": DUMP_FORMAT,
        "model": dump.model,
        "family": family,
        "block": str(dump.block),
        "step": str(dump.step),
        "grid": ",".join(map(str, dump.grid)),
        "layout": layout,
        "text_tokens": str(dump.text_tokens),
        "text_position": text_position,
        "stage": "post_rope",
        **({} if kv_len is None else {"kv_len": str(dump.kv_len)}),
        **extra,
    }
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in (("q", q), ("k", k), ("v", v))}
    save_safetensors_atomically(tensors, Path(path), meta)


def save_safetensors_atomically(tensors: dict, path: Path, metadata: dict) -> None:
    """``save_file`` under a temporary name in the same folder, then a rename: a stopped run never leaves a half
    file under the final name."""
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_qkv_dump(path: str | Path) -> QKVDump:
    """Read a dump written by :func:`save_qkv_dump`. Raises ValueError if the file is not one."""
    path = str(path)
    if not Path(path).is_file():
        raise ValueError(f"path must be an existing .safetensors dump, got {path!r}")
    with safe_open(path, framework="pt") as f:
        meta = dict(f.metadata() or {})
        if meta.get("format") != DUMP_FORMAT:
            raise ValueError(f"{path}: metadata 'format' must be {DUMP_FORMAT!r}, got {meta.get('format')!r}")
        if not {"q", "k", "v"} <= set(f.keys()):
            raise ValueError(f"{path}: a dump must hold tensors q, k, v; has {sorted(f.keys())}")
        q, k, v = (f.get_tensor(n) for n in ("q", "k", "v"))
    try:
        dump = QKVDump(
            q, k, v, model=meta["model"], family=meta["family"], block=int(meta["block"]),
            step=int(meta["step"]), grid=tuple(int(g) for g in meta["grid"].split(",")),
            layout=meta["layout"], text_tokens=int(meta["text_tokens"]),
            text_position=meta["text_position"],
            kv_len=int(meta["kv_len"]) if "kv_len" in meta else None,
            extra={a: b for a, b in meta.items() if a not in _RESERVED},
        )  # fmt: skip
    except (KeyError, ValueError) as err:
        raise ValueError(f"{path}: malformed dump metadata ({err!r})") from None
    _validate(dump)
    return dump
