"""The HunyuanVideo 1.5 family (diffusers 0.42.1): ``HunyuanVideo15Transformer3DModel``.

Facts read from diffusers 0.42.1 ``transformer_hunyuan_video15.py`` (``HunyuanVideo15TransformerBlock``,
``HunyuanVideo15AttnProcessor2_0``, ``HunyuanVideo15RotaryPosEmbed``), ``pipeline_hunyuan_video1_5.py`` /
``pipeline_hunyuan_video1_5_image2video.py`` and ``autoencoder_kl_hunyuanvideo15.py``:

* one stack of double-stream blocks, ``transformer_blocks`` (no single-stream stack): self-attention ``attn`` with
  the video projections (``to_q/k/v``, output ``to_out.0``) and the text ones (``add_q/k/v_proj``, output
  ``to_add_out``) apart; the token-refiner's attention (text only) is left alone;
* joint sequence [video, text], the text being the image-embedding, ByT5 and MLLM tokens the transformer concatenates
  (``image_embeds``, ``encoder_hidden_states_2``, ``encoder_hidden_states``: their lengths add up), valid tokens
  first; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on the video tokens: ``get_1d_rotary_pos_embed``
  per axis with ``use_real=True`` (interleaved pairs, angles in float32, arange positions), theta 256, split from the
  config's ``rope_axes_dim`` ((16, 56, 56) at D = 128): the same arithmetic as HunyuanVideo 1.0's;
* the mask: diffusers builds ``key_ok[j] & key_ok[i]`` [B, 1, N, N] from the text mask padded with ``True`` for the
  video tokens. Its key part is a prefix key-padding mask (the valid tokens are sorted first), so the quantized call
  takes per-batch valid key lengths; the padded text *queries*, which diffusers leaves attending nothing, attend the
  valid keys there instead -- their outputs are padding that no valid token reads (keys are masked in every block and
  only the video tokens leave the transformer). The model's own attention (FP16 path) gets diffusers' full mask;
* cond and uncond are separate forwards (the pipeline's ``ClassifierFreeGuidance`` guider); no ``_cp_plan``;
* the VAE's factors are ``spatial_compression_ratio`` (16) / ``temporal_compression_ratio`` (4), patch 1;
  ``check_inputs`` checks no size multiple (the latents floor ``height // 16``);
* 24 fps (121 frames = 5 s in the model card; diffusers' example writes its mp4 at 15);
* the pipelines' prompt cleaning needs no extra package;
* no paper schedule: no FP16-fallback preset (``none``).

The checkpoints' repo ids are the hunyuanvideo-community ``-Diffusers-`` repos (diffusers' docstring example names
``HunyuanVideo-1.5-480p_t2v``, without ``-Diffusers``; the repos in use carry it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry, TinyVariant
from rotvid.pipelines.families.hunyuan_video import _segments, _video_factors
from rotvid.pipelines.families.tiny_parts import HEAD_DIM, t5_text_encoder, tiny_tokenizer, vocab_size
from rotvid.pipelines.processors import RotvidProcessorBase
from rotvid.rope.facts import RopeFacts

__all__ = ["FAMILY", "HunyuanVideo15RotvidAttnProcessor"]

NAME = "hunyuan_video15"


class HunyuanVideo15RotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``HunyuanVideo15AttnProcessor2_0`` on ``HunyuanVideo15TransformerBlock.attn``.

    Joint sequence [video, text]; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on the video tokens;
    the key part of diffusers' [B, 1, N, N] mask becomes per-batch ``kv_lens`` (module docstring).
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # 1. QKV projections (B, N, H, D) and 2. QK normalization, as diffusers.
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        n_video = query.shape[1]

        # 4. Encoder condition QKV projection and normalization.
        if encoder_hidden_states is not None:
            encoder_query = attn.add_q_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            encoder_key = attn.add_k_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            encoder_value = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            if attn.norm_added_q is not None:
                encoder_query = attn.norm_added_q(encoder_query)
            if attn.norm_added_k is not None:
                encoder_key = attn.norm_added_k(encoder_key)
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)

        batch_size, seq_len, _, _ = query.shape
        attention_mask = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True)
        key_ok = attention_mask.bool().view(batch_size, 1, 1, seq_len)
        rows = key_ok.repeat(1, 1, seq_len, 1)
        full_mask = (rows & rows.transpose(2, 3)).bool()  # diffusers' mask, for the model's own attention

        def fp16(q, k, v, _key_mask):
            return self._dispatch_fp16(q, k, v, full_mask)

        # 3. RoPE on the video tokens (R alone on the text tokens), 5. attention.
        out = self._rotate_and_attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                      image_rotary_emb, (0, n_video), key_ok, fp16=fp16)
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


# The MLLM prompt: HunyuanVideo15Pipeline crops the first ``prompt_template_encode_start_idx`` (108) tokens of the
# chat-formatted prompt (the real template's system message). The tiny template puts exactly that many filler words
# in front of the user's prompt, so the crop leaves the prompt (and the padding after it).
_CROP_START = 108
_TINY_CHAT_TEMPLATE = (
    "{{ 'light ' * %d }}{%% for m in messages %%}{%% if m['role'] == 'user' %%}{{ m['content'] }}{%% endif %%}"
    "{%% endfor %%}" % _CROP_START
)


def _components(num_layers: int, seed: int) -> dict:
    """A tiny random HunyuanVideo 1.5 text-to-video pipeline's components: a 3-layer Qwen2.5-VL text model (its
    hidden states two layers from the end are the MLLM embedding), a 2-layer T5 for the ByT5 slot (called only for
    quoted text in a prompt), ``num_layers`` double-stream blocks and a 5-level VAE (spatial 16, temporal 4)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    text_dim = 32
    tokenizer = tiny_tokenizer(
        specials={"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        model_max_length=2048,
    )
    tokenizer.chat_template = _TINY_CHAT_TEMPLATE
    text_encoder = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=vocab_size(), hidden_size=text_dim, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        )
    ).eval()
    tokenizer_2, text_encoder_2 = t5_text_encoder(T5EncoderModel, T5Config, text_dim)
    latent = 4
    vae = AutoencoderKLHunyuanVideo15(latent_channels=latent, block_out_channels=(8, 8, 8, 8, 8),
                                      layers_per_block=1).eval()
    transformer = HunyuanVideo15Transformer3DModel(
        # the pipeline feeds cat([latents, condition latents, condition mask]) along channels
        in_channels=2 * latent + 1, out_channels=latent, num_attention_heads=2, attention_head_dim=HEAD_DIM,
        num_layers=num_layers, num_refiner_layers=1, mlp_ratio=1.0, text_embed_dim=text_dim,
        text_embed_2_dim=text_dim, image_embed_dim=16, rope_axes_dim=(8, 28, 28), task_type="t2v",
    ).eval()
    return dict(
        text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )


FAMILY = Family(
    name=NAME,
    transformer_classes=("HunyuanVideo15Transformer3DModel",),
    transformer_attrs=("transformer",),
    stacks=(
        BlockStack(
            attr="transformer_blocks",
            block_classes=("HunyuanVideo15TransformerBlock",),
            self_attention="attn",
            processor=HunyuanVideo15RotvidAttnProcessor,
            v_projections=("attn.to_v", "attn.add_v_proj"),
            out_projections=(("attn.to_out.0", "all"), ("attn.to_add_out", "all")),
        ),
    ),
    rope=RopeFacts(
        family=NAME,
        diffusers_source="diffusers.models.transformers.transformer_hunyuan_video15.HunyuanVideo15RotaryPosEmbed",
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
    pipeline_prefix="HunyuanVideo15",
    check_inputs_multiple=1,
    video_factors=_video_factors,
    text_arguments=("image_embeds", "encoder_hidden_states_2", "encoder_hidden_states"),
    models=(
        ModelEntry("hunyuanvideo1.5-t2v-480p", "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v", NAME,
                   "t2v"),
        ModelEntry("hunyuanvideo1.5-t2v-720p", "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v", NAME,
                   "t2v"),
        ModelEntry("hunyuanvideo1.5-i2v-480p", "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_i2v", NAME,
                   "i2v"),
        ModelEntry("hunyuanvideo1.5-i2v-720p", "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_i2v", NAME,
                   "i2v"),
    ),
    tiny=(
        # text-to-video. The call has no max_sequence_length: the pipeline fixes the MLLM text at 1000 tokens, ByT5 at
        # 256 and the image tokens at 729 in its __init__ (a 2,000-token joint sequence); the tiny one has 16 + 8 + 8
        TinyVariant("hunyuan_video15", "HunyuanVideo15Pipeline", _components, call_kwargs={"negative_prompt": "dark"},
                    max_sequence_length=None,
                    pipeline_attributes={"tokenizer_max_length": 16, "tokenizer_2_max_length": 8,
                                         "vision_num_semantic_tokens": 8}),
    ),
)
