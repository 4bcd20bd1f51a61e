"""The HunyuanVideo family (HunyuanVideo 1.0 in diffusers 0.42.1): ``HunyuanVideoTransformer3DModel``.

Facts read from diffusers 0.42.1 ``transformer_hunyuan_video.py`` (the double- and single-stream blocks,
``HunyuanVideoAttnProcessor2_0``, ``HunyuanVideoRotaryPosEmbed``), ``pipeline_hunyuan_video.py`` and
``autoencoder_kl_hunyuan_video.py``:

* two stacks: the double-stream ``transformer_blocks`` (video and text projections apart: V from ``attn.to_v`` and
  ``attn.add_v_proj``, the output read by ``attn.to_out.0`` and ``attn.to_add_out``) and the single-stream
  ``single_transformer_blocks`` (one ``proj_out`` reads ``cat([attention, mlp])``: its first heads·head_dim input
  columns carry the attention output); the text token-refiner's attention is left alone;
* joint sequence [video, text]; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on the video tokens;
  theta 256, angles in float32, split from the config's ``rope_axes_dim`` ((16, 56, 56) at D = 128; the default
  rule t = D // 8, h = w = the rest halved gives the same); the text-padding mask [B, 1, 1, N] is a key-padding
  mask (per-batch valid key lengths);
* cond and uncond are separate forwards (true CFG); no ``_cp_plan`` in diffusers 0.42.1;
* 24 fps; ``check_inputs`` wants multiples of 16; the VAE's factors are ``spatial_compression_ratio`` /
  ``temporal_compression_ratio``;
* paper schedule (RotateAttention §5.1): HunyuanVideo-T2V first 4 / last 2 steps, first and last 2 blocks (76%).
"""

from __future__ import annotations

import torch

from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry, SchedulePreset, TinyVariant
from rotvid.pipelines.families.tiny_parts import HEAD_DIM, tiny_tokenizer, vocab_size
from rotvid.pipelines.processors import RotvidProcessorBase
from rotvid.rope.facts import RopeFacts

__all__ = ["FAMILY", "HunyuanVideoRotvidAttnProcessor"]

NAME = "hunyuan_video"


class HunyuanVideoRotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``HunyuanVideoAttnProcessor2_0`` on the double- and single-stream blocks.

    Joint sequence [video, text]; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on
    the video tokens; the text-padding mask [B, 1, 1, N] becomes per-batch ``kv_lens``.
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        single_stream = attn.add_q_proj is None and encoder_hidden_states is not None
        if single_stream:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)

        # 1. QKV projections (B, N, H, D) and 2. QK norm, as diffusers.
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        # 4. Text-stream projections of the double-stream blocks.
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            encoder_query = attn.add_q_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            encoder_key = attn.add_k_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            encoder_value = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            if attn.norm_added_q is not None:
                encoder_query = attn.norm_added_q(encoder_query)
            if attn.norm_added_k is not None:
                encoder_key = attn.norm_added_k(encoder_key)
            n_video = query.shape[1]
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)
        elif single_stream:
            n_video = query.shape[1] - encoder_hidden_states.shape[1]
        else:
            n_video = query.shape[1]

        q = query.transpose(1, 2)
        k = key.transpose(1, 2)
        v = value.transpose(1, 2)
        # 3. RoPE on the video tokens (R alone on the text tokens), 5. attention.
        out = self._rotate_and_attend(q, k, v, image_rotary_emb, (0, n_video), attention_mask)
        hidden_states = out.transpose(1, 2).flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)

        # 6. Output projection.
        if encoder_hidden_states is not None:
            n_text = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-n_text], hidden_states[:, -n_text:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[0](hidden_states)
                hidden_states = attn.to_out[1](hidden_states)
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


def _segments(head_dim: int) -> tuple[int, int, int]:
    t = head_dim // 8
    rest = head_dim - t
    return t, rest // 2, rest - rest // 2


def _video_factors(vae, transformer) -> tuple:
    return vae("spatial_compression_ratio"), vae("temporal_compression_ratio"), 1


def _components(num_layers: int, seed: int) -> dict:
    """A tiny random HunyuanVideo pipeline's components: Llama + CLIP text encoders, ``num_layers`` blocks split
    between the double- and single-stream stacks."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    llama_dim, clip_dim = 32, 32
    tokenizer = tiny_tokenizer(
        specials={"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, post="bos"
    )
    text_encoder = LlamaModel(
        LlamaConfig(
            vocab_size=vocab_size(), hidden_size=llama_dim, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
        )
    ).eval()
    tokenizer_2 = tiny_tokenizer(
        specials={"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        post="bos_eos", model_max_length=77,
    )
    text_encoder_2 = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab_size(), hidden_size=clip_dim, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=77, projection_dim=clip_dim, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
        )
    ).eval()
    latent = 4
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=latent,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=True,
    ).eval()
    n_double = max(1, num_layers // 2)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=latent, out_channels=latent, num_attention_heads=2, attention_head_dim=HEAD_DIM,
        num_layers=n_double, num_single_layers=num_layers - n_double, num_refiner_layers=1, mlp_ratio=1.0,
        patch_size=1, patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=llama_dim,
        pooled_projection_dim=clip_dim, rope_theta=256.0, rope_axes_dim=(8, 28, 28),
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=7.0)
    return dict(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        vae=vae, transformer=transformer, scheduler=scheduler,
    )


FAMILY = Family(
    name=NAME,
    transformer_classes=("HunyuanVideoTransformer3DModel",),
    transformer_attrs=("transformer",),
    stacks=(
        BlockStack(
            attr="transformer_blocks",
            block_classes=("HunyuanVideoTransformerBlock", "HunyuanVideoTokenReplaceTransformerBlock"),
            self_attention="attn",
            processor=HunyuanVideoRotvidAttnProcessor,
            v_projections=("attn.to_v", "attn.add_v_proj"),
            out_projections=(("attn.to_out.0", "all"), ("attn.to_add_out", "all")),
        ),
        BlockStack(
            attr="single_transformer_blocks",
            block_classes=("HunyuanVideoSingleTransformerBlock", "HunyuanVideoTokenReplaceSingleTransformerBlock"),
            self_attention="attn",
            processor=HunyuanVideoRotvidAttnProcessor,
            v_projections=("attn.to_v",),
            out_projections=(("proj_out", "inner"),),
        ),
    ),
    rope=RopeFacts(
        family=NAME,
        diffusers_source="diffusers.models.transformers.transformer_hunyuan_video.HunyuanVideoRotaryPosEmbed",
        theta=256.0,
        pair_layout="interleaved",
        angle_dtype=torch.float32,
        position_grid="arange",
        segment_rule=_segments,
    ),
    rope_config_attr="rope_axes_dim",
    token_order="video,text",
    cfg_mode="separate",
    fps=24,
    pipeline_prefix="HunyuanVideo",
    check_inputs_multiple=16,
    video_factors=_video_factors,
    text_arguments=("encoder_hidden_states",),
    default_presets=(("t2v", "paper-hunyuan-t2v"), ("i2v", "paper-hunyuan-t2v")),
    schedule_presets=(
        SchedulePreset("paper-hunyuan-t2v", 4, 2, 2, 2,
                       source="RotateAttention §5.1, HunyuanVideo-T2V (76% quantized)"),
    ),
    models=(
        ModelEntry("hunyuanvideo-t2v", "hunyuanvideo-community/HunyuanVideo", NAME, "t2v", "paper-hunyuan-t2v"),
        ModelEntry("hunyuanvideo-i2v", "hunyuanvideo-community/HunyuanVideo-I2V", NAME, "i2v", "paper-hunyuan-t2v"),
    ),
    tiny=(
        # HunyuanVideo's default prompt_template has a crop_start (95) counted in the real Llama tokenizer's tokens:
        # with the tiny word-level tokenizer template words would leak into the text embedding; none here
        TinyVariant("hunyuan_video", "HunyuanVideoPipeline", _components,
                    call_defaults={"prompt_template": {"template": "{}", "crop_start": 0}},
                    call_kwargs={"guidance_scale": 6.0}),
    ),
)
