"""The Wan family (Wan 2.1 / 2.2 in diffusers 0.42.1): ``WanTransformer3DModel`` and the pipelines around it.

Facts read from diffusers 0.42.1 ``transformer_wan.py`` (``WanTransformerBlock``, ``WanAttnProcessor``,
``WanRotaryPosEmbed``), ``pipeline_wan.py`` / ``pipeline_wan_i2v.py`` and ``autoencoder_kl_wan.py``:

* one stack, ``blocks``; self-attention ``attn1`` (``attn2`` is cross-attention to the text / image context and is
  never touched); V from ``attn1.to_v``, the attention output read by ``attn1.to_out.0``;
* video tokens only in the self-attention, RoPE on all of them (``rotary_emb`` = (cos, sin), each [1, N, 1, D]);
  theta 10000, angles in float64, split h = w = 2·(D // 6), t = the rest ((44, 42, 42) at D = 128);
* Wan2.2 A14B has two experts (``transformer``, ``transformer_2``); cond and uncond are separate forwards;
* diffusers ships a context-parallel plan (``_cp_plan``); the VAE stays float32 (the Wan model cards);
* 16 fps (Wan2.2-TI2V-5B: 24); ``check_inputs`` wants height and width multiples of 16; the VAE's factors are
  ``scale_factor_spatial`` / ``scale_factor_temporal``; the RoPE table holds ``rope_max_seq_len`` positions per axis;
* ``WanImageToVideoPipeline`` calls ``ftfy.fix_text`` without the ``is_ftfy_available()`` guard ``WanPipeline`` has;
  its first latent frame is the conditioning image (Wan2.2 style);
* paper schedules (RotateAttention §5.1): Wan2.2-T2V first and last 2 steps and blocks (81% quantized),
  Wan2.2-I2V first 6 / last 4 steps, first and last 2 blocks (68%).

Also here: ``proxy``, the small Wan pipeline bundled with rotvid (:mod:`rotvid.pipelines.proxy`), loaded from the
package with no network.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry, SchedulePreset, TinyVariant
from rotvid.pipelines.families.tiny_parts import HEAD_DIM, t5_text_encoder
from rotvid.pipelines.processors import RotvidProcessorBase
from rotvid.rope.facts import RopeFacts

__all__ = ["FAMILY", "PROXY_FOLDER", "WanRotvidAttnProcessor"]

NAME = "wan"

# The proxy model's folder inside the package (rotvid/pipelines/proxy/weights).
PROXY_FOLDER = str(Path(__file__).resolve().parent.parent / "proxy" / "weights")


class WanRotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``WanAttnProcessor`` on ``WanTransformerBlock.attn1`` (self-attention).

    Tokens: video only, RoPE on all of them (``rotary_emb`` = (cos, sin), each [1, N, 1, D]).
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None or attn.add_k_proj is not None:
            raise RuntimeError(f"rotvid: {self.site.key} is installed as self-attention but got cross-attention inputs")
        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)

        query = attn.norm_q(query)
        key = attn.norm_k(key)

        q = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        v = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)

        out = self._rotate_and_attend(q, k, v, rotary_emb, (0, q.shape[2]), attention_mask)
        hidden_states = out.transpose(1, 2).flatten(2, 3)
        hidden_states = hidden_states.type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


def _segments(head_dim: int) -> tuple[int, int, int]:
    h = w = 2 * (head_dim // 6)
    return head_dim - h - w, h, w


def _video_factors(vae, transformer) -> tuple:
    return vae("scale_factor_spatial"), vae("scale_factor_temporal"), 1


def _components(num_layers: int, seed: int, *, two_experts: bool, image_to_video: bool = False) -> dict:
    """A tiny random Wan pipeline's components (see the tiny variants below)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    text_dim = 32
    tokenizer, text_encoder = t5_text_encoder(UMT5EncoderModel, UMT5Config, text_dim)
    z_dim = 4
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    ).eval()

    # Image-to-video (Wan2.2 I2V, no CLIP image encoder): the transformer reads
    # cat([noise latents (z_dim), frame mask (one channel per frame of a temporal VAE group),
    # VAE latents of [image, zeros...] (z_dim)]) along channels — WanImageToVideoPipeline.prepare_latents.
    in_channels = z_dim + vae.config.scale_factor_temporal + z_dim if image_to_video else z_dim

    def transformer():
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=in_channels,
            out_channels=z_dim, text_dim=text_dim, freq_dim=32, ffn_dim=64, num_layers=num_layers,
            cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        ).eval()

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    comps = dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                 transformer=transformer())
    if image_to_video:
        comps.update(image_encoder=None, image_processor=None)  # Wan2.2-style: no CLIP image embedding
    if two_experts:
        comps["transformer_2"] = transformer()
        comps["boundary_ratio"] = 0.875
    return comps


FAMILY = Family(
    name=NAME,
    transformer_classes=("WanTransformer3DModel",),
    transformer_attrs=("transformer", "transformer_2"),
    stacks=(
        BlockStack(
            attr="blocks",
            block_classes=("WanTransformerBlock",),
            self_attention="attn1",
            processor=WanRotvidAttnProcessor,
            v_projections=("attn1.to_v",),
            out_projections=(("attn1.to_out.0", "all"),),
        ),
    ),
    rope=RopeFacts(
        family=NAME,
        diffusers_source="diffusers.models.transformers.transformer_wan.WanRotaryPosEmbed",
        theta=10000.0,
        pair_layout="interleaved",
        angle_dtype=torch.float64,
        position_grid="arange",
        segment_rule=_segments,
    ),
    rope_config_attr=None,
    token_order="video",
    cfg_mode="separate",
    fps=16,
    pipeline_prefix="Wan",
    check_inputs_multiple=16,
    video_factors=_video_factors,
    float32_components=("vae",),
    context_parallel=True,
    rope_max_config_attr="rope_max_seq_len",
    first_frame_pipelines=("WanImageToVideoPipeline",),
    default_presets=(("t2v", "paper-wan2.2-t2v"), ("i2v", "paper-wan2.2-i2v")),
    schedule_presets=(
        SchedulePreset("paper-wan2.2-t2v", 2, 2, 2, 2, source="RotateAttention §5.1, Wan2.2-T2V (81% quantized)"),
        SchedulePreset("paper-wan2.2-i2v", 6, 4, 2, 2, source="RotateAttention §5.1, Wan2.2-I2V (68% quantized)"),
    ),
    pipeline_requirements=(("WanImageToVideoPipeline", ("ftfy",)),),
    models=(
        ModelEntry("wan2.1-t2v-1.3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", NAME, "t2v", "paper-wan2.2-t2v"),
        ModelEntry("wan2.1-t2v-14b", "Wan-AI/Wan2.1-T2V-14B-Diffusers", NAME, "t2v", "paper-wan2.2-t2v"),
        ModelEntry("wan2.1-i2v-14b-480p", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", NAME, "i2v", "paper-wan2.2-i2v"),
        ModelEntry("wan2.1-i2v-14b-720p", "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", NAME, "i2v", "paper-wan2.2-i2v"),
        ModelEntry("wan2.2-t2v-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", NAME, "t2v", "paper-wan2.2-t2v"),
        ModelEntry("wan2.2-i2v-a14b", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", NAME, "i2v", "paper-wan2.2-i2v"),
        ModelEntry("wan2.2-ti2v-5b", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", NAME, "ti2v", "paper-wan2.2-t2v", fps=24),
        # the bundled proxy: every block in low precision by default (the point of the model is to show
        # each recipe's error), so no FP16-fallback preset
        ModelEntry("proxy", PROXY_FOLDER, NAME, "t2v", "none", bundled=True),
    ),
    tiny=(
        # Wan2.1-style text-to-video
        TinyVariant("wan", "WanPipeline", partial(_components, two_experts=False),
                    call_kwargs={"negative_prompt": "dark", "guidance_scale": 5.0}),
        # two experts, transformer + transformer_2 with a boundary_ratio
        TinyVariant("wan2.2", "WanPipeline", partial(_components, two_experts=True),
                    call_kwargs={"negative_prompt": "dark", "guidance_scale": 5.0}),
        # Wan2.2-style image-to-video: no CLIP image encoder, one expert
        TinyVariant("wan-i2v", "WanImageToVideoPipeline", partial(_components, two_experts=False, image_to_video=True),
                    call_kwargs={"negative_prompt": "dark", "guidance_scale": 5.0}, takes_image=True),
    ),
)
