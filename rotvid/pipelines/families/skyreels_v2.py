"""The SkyReels-V2 family (diffusers 0.42.1): ``SkyReelsV2Transformer3DModel``, a Wan 2.1 architecture.

Facts read from diffusers 0.42.1 ``transformer_skyreels_v2.py`` (``SkyReelsV2TransformerBlock``,
``SkyReelsV2AttnProcessor``, ``SkyReelsV2RotaryPosEmbed``) and ``pipelines/skyreels_v2/``:

* one stack, ``blocks``; self-attention ``attn1`` (``attn2`` is cross-attention to the text / image context and is
  never touched); V from ``attn1.to_v``, the attention output read by ``attn1.to_out.0``; the processor's maths is
  Wan's line for line (``diff`` of the two files: names and the parallel config only);
* video tokens only, RoPE on all of them (``rotary_emb`` = (cos, sin), each [1, N, 1, D]): theta 10000, angles in
  float64, split h = w = 2·(D // 6), t = the rest ((44, 42, 42) at D = 128) -- Wan's table;
* the self-attention takes an ``attention_mask``: ``None``, except in a diffusion-forcing run with
  ``causal_block_size`` > 1, where it is a block-causal [1, 1, N, N] mask. That is no key-padding mask, so those
  calls run the model's own attention and the run report counts them as fallbacks (never a silent change);
* cond and uncond are separate forwards; no ``_cp_plan`` in diffusers 0.42.1; the VAE (``AutoencoderKLWan``) stays
  float32, as the diffusers examples load it;
* ``check_inputs`` wants height and width multiples of 16; the VAE's factors are ``scale_factor_spatial`` /
  ``scale_factor_temporal``; the RoPE table holds ``rope_max_seq_len`` positions per axis;
* 24 fps (97 frames at 540P, 121 at 720P; diffusers' example writes its mp4 at 24);
* every SkyReels-V2 pipeline's prompt cleaning calls ``ftfy.fix_text`` without an ``is_ftfy_available()`` guard;
* no paper schedule: no FP16-fallback preset (``none``).

Why SkyReels-V2 and not LTX-Video (diffusers ``LTXVideoTransformer3DModel``): LTX's RoPE does not fit rotvid's
rotations. ``LTXVideoRotaryPosEmbed`` is built over the whole inner dim (``dim=inner_dim``) and applied to Q and K
before they are split into heads, its axes interleaved pair by pair (t, h, w, t, h, w, ...) with ``inner_dim % 6``
identity channels in front: every head gets its own frequencies and its own assignment of pairs to axes, there are
no contiguous per-axis segments for the ``half`` rotation's pairing, and the table carries a batch axis of
fractional positions. rotvid's RoPE·R tables (and the CUDA pre-processing that applies them) are one [N, D] table
shared by every head; taking LTX would need per-head tables -- a new kernel input.
"""

from __future__ import annotations

import torch

from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry, TinyVariant
from rotvid.pipelines.families.tiny_parts import HEAD_DIM, t5_text_encoder
from rotvid.pipelines.families.wan import WanRotvidAttnProcessor, _segments, _video_factors
from rotvid.rope.facts import RopeFacts

__all__ = ["FAMILY", "SkyReelsV2RotvidAttnProcessor"]

NAME = "skyreels_v2"
_REPO = "Skywork/SkyReels-V2-{}-Diffusers"


class SkyReelsV2RotvidAttnProcessor(WanRotvidAttnProcessor):
    """Replaces ``SkyReelsV2AttnProcessor`` on ``SkyReelsV2TransformerBlock.attn1`` (self-attention).

    Tokens: video only, RoPE on all of them (``rotary_emb`` = (cos, sin), each [1, N, 1, D]); ``attention_mask`` is
    the causal block mask of a diffusion-forcing run (``None`` otherwise).

    The maths is Wan's line for line, so the call is :class:`WanRotvidAttnProcessor`'s.
    """


def _components(num_layers: int, seed: int) -> dict:
    """A tiny random SkyReels-V2 text-to-video pipeline's components (a UMT5 text encoder, a Wan VAE)."""
    from diffusers import AutoencoderKLWan, SkyReelsV2Transformer3DModel, UniPCMultistepScheduler
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    text_dim = 32
    tokenizer, text_encoder = t5_text_encoder(UMT5EncoderModel, UMT5Config, text_dim)
    z_dim = 4
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    ).eval()
    transformer = SkyReelsV2Transformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=z_dim,
        out_channels=z_dim, text_dim=text_dim, freq_dim=32, ffn_dim=64, num_layers=num_layers, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0)
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler, transformer=transformer)


_PIPELINES = (
    "SkyReelsV2Pipeline", "SkyReelsV2ImageToVideoPipeline", "SkyReelsV2DiffusionForcingPipeline",
    "SkyReelsV2DiffusionForcingImageToVideoPipeline", "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
)

FAMILY = Family(
    name=NAME,
    transformer_classes=("SkyReelsV2Transformer3DModel",),
    transformer_attrs=("transformer",),
    stacks=(
        BlockStack(
            attr="blocks",
            block_classes=("SkyReelsV2TransformerBlock",),
            self_attention="attn1",
            processor=SkyReelsV2RotvidAttnProcessor,
            v_projections=("attn1.to_v",),
            out_projections=(("attn1.to_out.0", "all"),),
        ),
    ),
    rope=RopeFacts(
        family=NAME,
        diffusers_source="diffusers.models.transformers.transformer_skyreels_v2.SkyReelsV2RotaryPosEmbed",
        theta=10000.0,
        pair_layout="interleaved",
        angle_dtype=torch.float64,
        position_grid="arange",
        segment_rule=_segments,
    ),
    rope_config_attr=None,
    token_order="video",
    cfg_mode="separate",
    fps=24,
    pipeline_prefix="SkyReelsV2",
    check_inputs_multiple=16,
    video_factors=_video_factors,
    float32_components=("vae",),
    rope_max_config_attr="rope_max_seq_len",
    pipeline_requirements=tuple((cls, ("ftfy",)) for cls in _PIPELINES),
    models=(
        ModelEntry("skyreels-v2-t2v-14b-540p", _REPO.format("T2V-14B-540P"), NAME, "t2v"),
        ModelEntry("skyreels-v2-t2v-14b-720p", _REPO.format("T2V-14B-720P"), NAME, "t2v"),
        ModelEntry("skyreels-v2-i2v-1.3b-540p", _REPO.format("I2V-1.3B-540P"), NAME, "i2v"),
        ModelEntry("skyreels-v2-i2v-14b-540p", _REPO.format("I2V-14B-540P"), NAME, "i2v"),
        ModelEntry("skyreels-v2-i2v-14b-720p", _REPO.format("I2V-14B-720P"), NAME, "i2v"),
        ModelEntry("skyreels-v2-df-1.3b-540p", _REPO.format("DF-1.3B-540P"), NAME, "t2v"),
        ModelEntry("skyreels-v2-df-14b-540p", _REPO.format("DF-14B-540P"), NAME, "t2v"),
        ModelEntry("skyreels-v2-df-14b-720p", _REPO.format("DF-14B-720P"), NAME, "t2v"),
        ModelEntry("skyreels-v2-flf2v-1.3b-540p", _REPO.format("FLF2V-1.3B-540P"), NAME, "i2v"),
    ),
    tiny=(
        TinyVariant("skyreels_v2", "SkyReelsV2Pipeline", _components,
                    call_kwargs={"negative_prompt": "dark", "guidance_scale": 6.0}),
    ),
)
