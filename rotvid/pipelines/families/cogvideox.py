"""The CogVideoX family (CogVideoX 1.0 / 1.5 in diffusers 0.42.1): ``CogVideoXTransformer3DModel``.

Facts read from diffusers 0.42.1 ``cogvideox_transformer_3d.py`` (``CogVideoXBlock``),
``attention_processor.CogVideoXAttnProcessor2_0``, ``embeddings.get_3d_rotary_pos_embed``, ``pipeline_cogvideox.py``
and ``autoencoder_kl_cogvideox.py``:

* one stack, ``transformer_blocks``; self-attention ``attn1`` over the joint sequence [text, video]; V from
  ``attn1.to_v``, the output read by ``attn1.to_out.0``; the processor calls ``F.scaled_dot_product_attention``
  directly (not diffusers' dispatcher);
* RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on the video tokens only, switched by the config's
  ``use_rotary_positional_embeddings`` (the 2B checkpoint has none: R alone on every token); theta 10000, angles in
  float32, split t = D // 4, h = w = D // 8 · 3 ((16, 24, 24) at D = 64), positions a cropped linspace (1.0) or
  arange ("slice", 1.5);
* cond and uncond batched in one forward; no ``_cp_plan`` in diffusers 0.42.1; latents [B, F, C, H, W];
* 8 fps (49 frames = 6 s); ``check_inputs`` wants multiples of 8; the spatial factor comes from the VAE's block
  count (2 ** (blocks - 1)), the temporal one is ``temporal_compression_ratio``; CogVideoX 1.5's ``patch_size_t``
  needs a latent frame count divisible by it;
* the paper has no schedule for CogVideoX: no FP16-fallback preset.
"""

from __future__ import annotations

from functools import partial

import torch

from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry, TinyVariant
from rotvid.pipelines.families.tiny_parts import HEAD_DIM, TEXT_LEN, t5_text_encoder
from rotvid.pipelines.processors import RotvidProcessorBase
from rotvid.rope.facts import RopeFacts

__all__ = ["FAMILY", "CogVideoXRotvidAttnProcessor"]

NAME = "cogvideox"


class CogVideoXRotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``CogVideoXAttnProcessor2_0`` on ``CogVideoXBlock.attn1``.

    Joint sequence [text, video]; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on
    the video tokens only — and none at all for CogVideoX-2B, where R applies to every token.
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size, sequence_length, _ = hidden_states.shape

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        inner_dim = key.shape[-1]
        head_dim = inner_dim // attn.heads
        q = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        k = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        v = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)

        span = (text_seq_length, sequence_length)
        out = self._rotate_and_attend(q, k, v, image_rotary_emb, span, attention_mask, fp16=self._sdpa_fp16)
        hidden_states = out.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


def _segments(head_dim: int) -> tuple[int, int, int]:
    return head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3


def _video_factors(vae, transformer) -> tuple:
    channels = vae("block_out_channels")  # the pipeline derives the spatial factor from the VAE's block count
    spatial = 2 ** (len(channels) - 1) if channels else None
    return spatial, vae("temporal_compression_ratio"), int(transformer("patch_size_t") or 1)


def _components(num_layers: int, seed: int, *, rope: bool) -> dict:
    """A tiny random CogVideoX pipeline's components (5B-style with RoPE, or 2B-style without)."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    text_dim = 32
    tokenizer, text_encoder = t5_text_encoder(T5EncoderModel, T5Config, text_dim)
    latent = 4
    vae = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, latent_channels=latent,
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
        sample_height=32, sample_width=32,
    ).eval()
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=latent, out_channels=latent,
        time_embed_dim=32, text_embed_dim=text_dim, num_layers=num_layers, sample_width=4, sample_height=4,
        sample_frames=5, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=TEXT_LEN,
        use_rotary_positional_embeddings=rope,
    ).eval()
    scheduler = CogVideoXDDIMScheduler(timestep_spacing="trailing", rescale_betas_zero_snr=True,
                                       prediction_type="v_prediction")
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler)


_CALL = {"negative_prompt": "dark", "guidance_scale": 6.0, "use_dynamic_cfg": False}

FAMILY = Family(
    name=NAME,
    transformer_classes=("CogVideoXTransformer3DModel",),
    transformer_attrs=("transformer",),
    stacks=(
        BlockStack(
            attr="transformer_blocks",
            block_classes=("CogVideoXBlock",),
            self_attention="attn1",
            processor=CogVideoXRotvidAttnProcessor,
            v_projections=("attn1.to_v",),
            out_projections=(("attn1.to_out.0", "all"),),
        ),
    ),
    rope=RopeFacts(
        family=NAME,
        diffusers_source="diffusers.models.embeddings.get_3d_rotary_pos_embed",
        theta=10000.0,
        pair_layout="interleaved",
        angle_dtype=torch.float32,
        position_grid="linspace",
        segment_rule=_segments,
    ),
    rope_config_attr=None,
    token_order="text,video",
    cfg_mode="batched",
    fps=8,
    pipeline_prefix="CogVideoX",
    check_inputs_multiple=8,
    video_factors=_video_factors,
    rope_switch_config_attr="use_rotary_positional_embeddings",
    latent_layout="BFCHW",
    text_arguments=("encoder_hidden_states",),
    default_presets=(("t2v", "none"), ("i2v", "none")),
    models=(
        ModelEntry("cogvideox-2b", "THUDM/CogVideoX-2b", NAME, "t2v"),
        ModelEntry("cogvideox-5b", "THUDM/CogVideoX-5b", NAME, "t2v"),
        ModelEntry("cogvideox-5b-i2v", "THUDM/CogVideoX-5b-I2V", NAME, "i2v"),
    ),
    tiny=(
        # 5B-style, with RoPE
        TinyVariant("cogvideox", "CogVideoXPipeline", partial(_components, rope=True), call_kwargs=_CALL),
        # 2B-style, no RoPE
        TinyVariant("cogvideox-2b", "CogVideoXPipeline", partial(_components, rope=False), call_kwargs=_CALL),
    ),
)
