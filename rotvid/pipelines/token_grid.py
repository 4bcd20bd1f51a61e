"""The token grid of one transformer forward: where the tokens of its self-attention sequence sit.

A static block map (``radial``, :mod:`rotvid.kernels.sparsity.radial`) is built from a
:class:`~rotvid.kernels.sparsity.TokenGrid`: the video tokens' (frames, height, width) *after patchifying*, and the
conditioning tokens before (``prefix``) and after (``suffix``) them. The facts come from the family
(:class:`~rotvid.pipelines.families.base.Family`) and the forward's own inputs:

* the latent ``hidden_states`` in the family's ``latent_layout`` (``[B, C, F, H, W]`` or ``[B, F, C, H, W]``),
  divided by the transformer config's patch sizes (``patch_size = (t, h, w)``, or ``patch_size`` and
  ``patch_size_t``), floor division as diffusers does;
* the text tokens of a joint sequence: the lengths of the family's ``text_arguments`` (``encoder_hidden_states``,
  ...) added up, a suffix for ``token_order`` ``"video,text"``, a prefix for ``"text,video"``;
* an image-to-video pipeline (the family's ``first_frame_pipelines``) makes its first latent frame conditioning:
  its ``height * width`` tokens join the prefix, and the grid has one frame less. rotvid applied to a bare
  transformer knows no pipeline: its first frame counts as video.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from torch import nn

from rotvid.kernels.sparsity import TokenGrid
from rotvid.pipelines.families.base import Family

__all__ = ["forward_token_grid", "patch_sizes"]


def patch_sizes(transformer: nn.Module) -> tuple[int, int, int]:
    """``(t, h, w)`` patch sizes of a transformer's config (``patch_size`` (t, h, w), or ``patch_size`` and
    ``patch_size_t``, None meaning 1)."""
    cfg = transformer.config
    patch = cfg.get("patch_size")
    if isinstance(patch, (list, tuple)):
        pt, ph, pw = (int(x) for x in patch)
        return pt, ph, pw
    return int(cfg.get("patch_size_t") or 1), int(patch), int(patch)


@lru_cache(maxsize=16)
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.forward)


def _arguments(transformer: nn.Module, args: tuple, kwargs: dict) -> dict:
    try:
        bound = _signature(type(transformer)).bind_partial(transformer, *args, **kwargs)
    except TypeError as err:
        raise ValueError(f"grid: the arguments of {type(transformer).__name__}.forward do not bind ({err})") from None
    return bound.arguments


def forward_token_grid(
    family: Family, transformer: nn.Module, args: tuple, kwargs: dict, *, first_frame: bool = False
) -> tuple[TokenGrid, torch.device]:
    """The :class:`~rotvid.kernels.sparsity.TokenGrid` of the self-attention sequence of ``transformer`` (of
    ``family``) called with ``args`` / ``kwargs`` (module docstring), and the device of its latents (where the
    attention runs). ``first_frame``: the pipeline's first latent frame is the conditioning image. ValueError naming
    ``grid`` when the inputs do not tell."""
    arguments = _arguments(transformer, args, kwargs)
    latents = arguments.get("hidden_states")
    if not isinstance(latents, torch.Tensor) or latents.dim() != 5:
        got = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
        raise ValueError(f"grid: expected 5-D latent hidden_states ({family.latent_layout}), got {got}")
    f_axis = family.latent_layout.index("F")
    frames, height, width = latents.shape[f_axis], latents.shape[3], latents.shape[4]
    pt, ph, pw = patch_sizes(transformer)
    frames, height, width = frames // pt, height // ph, width // pw
    text = 0
    for name in family.text_arguments:
        tokens = arguments.get(name)
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 3:
            raise ValueError(f"grid: expected {name} [B, L, C] (the text tokens of the joint "
                             f"sequence), got {type(tokens).__name__}")
        text += int(tokens.shape[1])
    prefix = text if family.token_order.startswith("text") else 0
    suffix = text if family.token_order.endswith("text") else 0
    if first_frame:
        if frames < 2:
            raise ValueError(f"grid: an image-to-video forward of {frames} latent frame(s) has no frame beside the "
                             "conditioning one")
        prefix += height * width
        frames -= 1
    return TokenGrid(int(frames), int(height), int(width), prefix=prefix, suffix=suffix), latents.device
