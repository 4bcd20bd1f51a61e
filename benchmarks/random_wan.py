"""Wan transformers with random weights, fed random inputs of the real shapes: speed does not depend on the weights'
values, so the benchmarks build the released architectures without downloading them."""

from __future__ import annotations

import torch

# The released configs of ``WanTransformer3DModel``: Wan2.1-T2V-1.3B and the Wan2.1/2.2-14B blocks.
WAN21_13B = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6,
)
WAN_14B = dict(
    patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6,
)
LATENT_480P = (1, 16, 21, 60, 104)  # B, C, F, H, W: 480x832, 81 frames -> 32760 video tokens
LATENT_720P = (1, 16, 21, 90, 160)  # 720x1280, 81 frames -> 75600 video tokens


def cast_like_from_pretrained(model, dtype: torch.dtype) -> None:
    """Cast parameters to ``dtype`` except the modules diffusers keeps in float32 when loading
    (``model._keep_in_fp32_modules``: Wan's rope, time embedder, scale/shift tables, norms)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, p in model.named_parameters():
        parts = set(name.split("."))
        p.data = p.data.to(torch.float32 if parts & keep else dtype)


def random_wan_transformer(config: dict, device, dtype: torch.dtype):
    """``WanTransformer3DModel(**config)`` in eval mode with random weights drawn on ``device`` from the current RNG
    state, created in ``dtype`` (no float32 copy of the whole model at any point: Wan 14B is 28 GB in bf16) and cast
    as ``from_pretrained`` casts (:func:`cast_like_from_pretrained`)."""
    from diffusers import WanTransformer3DModel

    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = WanTransformer3DModel(**config)
    finally:
        torch.set_default_dtype(default_dtype)
    cast_like_from_pretrained(model, dtype)
    return model.eval()


def build_random_wan(config: dict, latent: tuple, text_len: int, device: str, dtype: torch.dtype, seed: int):
    """``(model, inputs)``: ``WanTransformer3DModel(**config)`` with random weights (seed ``seed``), cast as
    ``from_pretrained`` casts, in eval mode without gradients; ``inputs`` the forward's keyword arguments: random
    latents of shape ``latent``, a random text embedding of ``text_len`` tokens (seed ``seed + 1``), timestep 500.

    The parameters are created in ``dtype`` on ``device`` (the modules kept in float32 cast up afterwards): no float32
    copy of the whole model exists at any point (Wan 14B: 28 GB in bf16, 56 GB in float32)."""
    torch.manual_seed(seed)
    model = random_wan_transformer(config, device, dtype).requires_grad_(False)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(latent, generator=g, device=device, dtype=dtype)
    text = torch.randn(1, text_len, config["text_dim"], generator=g, device=device, dtype=dtype)
    t = torch.tensor([500.0], device=device)
    return model, dict(hidden_states=x, encoder_hidden_states=text, timestep=t, return_dict=False)


def video_tokens(config: dict, latent: tuple) -> int:
    """Video tokens of one sample after patchifying: (F / pf) (H / ph) (W / pw)."""
    _, _, f, h, w = latent
    p = config["patch_size"]
    return (f // p[0]) * (h // p[1]) * (w // p[2])
