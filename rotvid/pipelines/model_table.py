"""Per-model facts for the pipelines: ONE table, read by loading, ``apply``/``remove`` and the tiny builders.

Everything rotvid needs to know about a diffusers video model lives here, not in scattered
``if model == ...`` branches:

* which pipeline components are transformers (Wan2.2 A14B has two experts: ``transformer`` and
  ``transformer_2``), their class names;
* the block stacks of each transformer (HunyuanVideo has a double-stream and a single-stream
  stack), the block classes in them, and which attention module of a block is the
  **self**-attention (Wan's ``attn2`` is cross-attention to text / image context and is never
  touched);
* the ``nn.Linear`` layers that carry V (rows get ``W_v·H`` per head) and that read the attention
  output (columns get ``Hᵀ·W_o`` per head) — for the V/O Hadamard fusion;
* the key of the family in :data:`rotvid.rope.model_facts.ROPE_FACTS`, the token order of the
  joint sequence, and how classifier-free guidance is run (for the step tracker's docs/report);
* where the video tokens of the self-attention sequence come from (the layout of the transformer's latent input,
  the argument holding the text tokens of a joint sequence, the pipelines whose first latent frame is the
  conditioning image): the token grid a static block map is built from (:mod:`rotvid.pipelines.token_grid`);
* the frame rate each family (and, where it differs, each checkpoint) was trained at — the fps
  ``rotvid generate`` writes its mp4s with;
* the Python packages a diffusers pipeline class needs at call time beyond rotvid's own
  dependencies (checked before a run so a missing one is one clear error, not a ``NameError``);
* friendly short names of the released checkpoints and their diffusers repo ids, and of the
  model bundled with rotvid (``proxy``: a small Wan pipeline trained on procedural clips,
  :mod:`rotvid.pipelines.proxy`, loaded from the package with no network).

Facts were read from diffusers 0.42.1 (``transformer_wan.py``, ``transformer_hunyuan_video.py``,
``cogvideox_transformer_3d.py`` and ``attention_processor.CogVideoXAttnProcessor2_0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BlockStack",
    "ModelFamily",
    "ModelEntry",
    "FAMILIES",
    "MODELS",
    "DEFAULT_MODEL",
    "PROXY_FOLDER",
    "PIPELINE_REQUIREMENTS",
    "family_of_transformer",
    "family_by_name",
    "model_entry",
    "frame_rate",
]


@dataclass(frozen=True)
class BlockStack:
    """One stack of transformer blocks that each hold one self-attention.

    Attributes:
        attr: name of the ``nn.ModuleList`` on the transformer (``"blocks"``, ``"transformer_blocks"``).
        block_classes: class names accepted in that list.
        self_attention: attribute of the block holding the self-attention module.
        processor_kind: which rotvid processor mirrors the diffusers maths of that attention
            (a key of ``rotvid.pipelines.processors.PROCESSORS``).
        v_projections: dotted paths (relative to the block) of the linears that produce V; their
            output rows get ``W·H`` per head. A fused ``to_qkv`` (diffusers ``fuse_projections``)
            is handled by the fusion code itself.
        out_projections: ``(path, columns)`` of the linears that read the attention output;
            ``columns`` is ``"all"`` or ``"inner"`` (only the first ``heads·head_dim`` input
            columns carry attention output, as in HunyuanVideo's single-stream ``proj_out`` that
            reads ``cat([attn, mlp])``).
    """

    attr: str
    block_classes: tuple[str, ...]
    self_attention: str
    processor_kind: str
    v_projections: tuple[str, ...]
    out_projections: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ModelFamily:
    """The facts of one model family.

    Attributes:
        name: ``"wan"`` | ``"hunyuan_video"`` | ``"cogvideox"``.
        transformer_classes: class names of the denoiser.
        transformer_attrs: pipeline attributes that may hold a denoiser (in this order); missing
            or ``None`` ones are skipped.
        stacks: the block stacks, in execution order (global block index runs across them).
        rope_family: key in ``ROPE_FACTS`` (RoPE segment sizes for the ``half`` rotation).
        rope_config_attr: transformer config attribute that overrides the segment sizes
            (HunyuanVideo's ``rope_axes_dim``), or ``None``.
        token_order: order of the joint self-attention sequence: ``"video"`` (Wan: video only),
            ``"video,text"`` (HunyuanVideo), ``"text,video"`` (CogVideoX). RoPE covers the video
            tokens; text tokens get the rotation alone.
        cfg_mode: ``"separate"`` (cond and uncond are two forwards per step: Wan, HunyuanVideo
            with true CFG) or ``"batched"`` (one forward on a doubled batch: CogVideoX).
        fps: frame rate (frames per second) of the videos the family was trained on: Wan 2.1/2.2
            16, HunyuanVideo 24, CogVideoX 1.0 8 (49 frames = 6 s). A checkpoint that differs
            says so in its :class:`ModelEntry`.
        float32_components: pipeline components kept in float32 by :func:`load_pipeline`
            (Wan's VAE, as the Wan model cards recommend).
        context_parallel: diffusers ships a context-parallel plan (``_cp_plan``) for the family's
            transformer, so rotvid runs it under Ulysses context parallelism
            (:mod:`rotvid.pipelines.context_parallel`): Wan in diffusers 0.42.1; HunyuanVideo and
            CogVideoX have none.
        rope_switch_config_attr: transformer config attribute that turns RoPE on (CogVideoX's
            ``use_rotary_positional_embeddings``: the 2B checkpoint has none), or ``None`` when the family
            always has RoPE.
        latent_layout: the layout of the transformer's ``hidden_states`` input: ``"BCFHW"`` (Wan,
            HunyuanVideo) or ``"BFCHW"`` (CogVideoX); patchified by the config's ``patch_size`` (Wan: (t, h, w))
            and ``patch_size_t``, flattened frame-major into the video tokens.
        text_argument: the transformer forward's argument whose tokens join the self-attention sequence
            (``encoder_hidden_states`` [B, L, C] for HunyuanVideo and CogVideoX, placed by ``token_order``), or
            ``None`` (Wan: text enters through cross-attention only).
        first_frame_pipelines: pipeline classes whose first latent frame is the conditioning image (Wan2.x I2V):
            its tokens count as conditioning tokens of the static block maps.
    """

    name: str
    transformer_classes: tuple[str, ...]
    transformer_attrs: tuple[str, ...]
    stacks: tuple[BlockStack, ...]
    rope_family: str
    rope_config_attr: str | None
    token_order: str
    cfg_mode: str
    fps: int
    float32_components: tuple[str, ...] = ()
    context_parallel: bool = False
    rope_switch_config_attr: str | None = None
    latent_layout: str = "BCFHW"
    text_argument: str | None = None
    first_frame_pipelines: tuple[str, ...] = ()


FAMILIES: dict[str, ModelFamily] = {
    "wan": ModelFamily(
        name="wan",
        transformer_classes=("WanTransformer3DModel",),
        transformer_attrs=("transformer", "transformer_2"),
        stacks=(
            BlockStack(
                attr="blocks",
                block_classes=("WanTransformerBlock",),
                self_attention="attn1",
                processor_kind="wan",
                v_projections=("attn1.to_v",),
                out_projections=(("attn1.to_out.0", "all"),),
            ),
        ),
        rope_family="wan",
        rope_config_attr=None,
        token_order="video",
        cfg_mode="separate",
        fps=16,
        float32_components=("vae",),
        context_parallel=True,
        first_frame_pipelines=("WanImageToVideoPipeline",),
    ),
    "hunyuan_video": ModelFamily(
        name="hunyuan_video",
        transformer_classes=("HunyuanVideoTransformer3DModel",),
        transformer_attrs=("transformer",),
        stacks=(
            BlockStack(
                attr="transformer_blocks",
                block_classes=("HunyuanVideoTransformerBlock", "HunyuanVideoTokenReplaceTransformerBlock"),
                self_attention="attn",
                processor_kind="hunyuan_video",
                v_projections=("attn.to_v", "attn.add_v_proj"),
                out_projections=(("attn.to_out.0", "all"), ("attn.to_add_out", "all")),
            ),
            BlockStack(
                attr="single_transformer_blocks",
                block_classes=(
                    "HunyuanVideoSingleTransformerBlock",
                    "HunyuanVideoTokenReplaceSingleTransformerBlock",
                ),
                self_attention="attn",
                processor_kind="hunyuan_video",
                v_projections=("attn.to_v",),
                out_projections=(("proj_out", "inner"),),
            ),
        ),
        rope_family="hunyuan_video",
        rope_config_attr="rope_axes_dim",
        token_order="video,text",
        cfg_mode="separate",
        fps=24,
        text_argument="encoder_hidden_states",
    ),
    "cogvideox": ModelFamily(
        name="cogvideox",
        transformer_classes=("CogVideoXTransformer3DModel",),
        transformer_attrs=("transformer",),
        stacks=(
            BlockStack(
                attr="transformer_blocks",
                block_classes=("CogVideoXBlock",),
                self_attention="attn1",
                processor_kind="cogvideox",
                v_projections=("attn1.to_v",),
                out_projections=(("attn1.to_out.0", "all"),),
            ),
        ),
        rope_family="cogvideox",
        rope_config_attr=None,
        token_order="text,video",
        cfg_mode="batched",
        fps=8,
        rope_switch_config_attr="use_rotary_positional_embeddings",
        latent_layout="BFCHW",
        text_argument="encoder_hidden_states",
    ),
}


@dataclass(frozen=True)
class ModelEntry:
    """A released checkpoint: friendly short name -> diffusers repo id, family, schedule preset.

    ``fps``: the checkpoint's frame rate where it differs from its family's
    (:attr:`ModelFamily.fps`); ``None`` means the family's. ``bundled``: the model ships inside
    the rotvid package and ``repo_id`` is its folder there (loaded locally, never from the hub).
    """

    name: str
    repo_id: str
    family: str
    task: str
    preset: str | None = None
    fps: int | None = None
    bundled: bool = False


# The proxy model's folder inside the package (rotvid/pipelines/proxy/weights).
PROXY_FOLDER = str(Path(__file__).resolve().parent / "proxy" / "weights")

MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry("wan2.1-t2v-1.3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan", "t2v", "paper-wan2.2-t2v"),
        ModelEntry("wan2.1-t2v-14b", "Wan-AI/Wan2.1-T2V-14B-Diffusers", "wan", "t2v", "paper-wan2.2-t2v"),
        ModelEntry("wan2.1-i2v-14b-480p", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", "wan", "i2v", "paper-wan2.2-i2v"),
        ModelEntry("wan2.1-i2v-14b-720p", "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", "wan", "i2v", "paper-wan2.2-i2v"),
        ModelEntry("wan2.2-t2v-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "wan", "t2v", "paper-wan2.2-t2v"),
        ModelEntry("wan2.2-i2v-a14b", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", "wan", "i2v", "paper-wan2.2-i2v"),
        ModelEntry("wan2.2-ti2v-5b", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "wan", "ti2v", "paper-wan2.2-t2v", fps=24),
        ModelEntry("hunyuanvideo-t2v", "hunyuanvideo-community/HunyuanVideo", "hunyuan_video", "t2v", "paper-hunyuan-t2v"),
        ModelEntry("hunyuanvideo-i2v", "hunyuanvideo-community/HunyuanVideo-I2V", "hunyuan_video", "i2v", "paper-hunyuan-t2v"),
        ModelEntry("cogvideox-2b", "THUDM/CogVideoX-2b", "cogvideox", "t2v"),
        ModelEntry("cogvideox-5b", "THUDM/CogVideoX-5b", "cogvideox", "t2v"),
        ModelEntry("cogvideox-5b-i2v", "THUDM/CogVideoX-5b-I2V", "cogvideox", "i2v"),
        # the bundled proxy: every block in low precision by default (the point of the model is to show
        # each recipe's error), so no FP16-fallback preset
        ModelEntry("proxy", PROXY_FOLDER, "wan", "t2v", "none", bundled=True),
    )
}

DEFAULT_MODEL = "wan2.1-t2v-1.3b"

# Packages a pipeline class imports only when available but then calls unconditionally
# (diffusers 0.42.1: WanImageToVideoPipeline's prompt cleaning calls ``ftfy.fix_text`` without the
# ``is_ftfy_available()`` guard WanPipeline has). Keyed by pipeline class name.
PIPELINE_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "WanImageToVideoPipeline": ("ftfy",),
}


def family_of_transformer(transformer) -> ModelFamily:
    """The family whose ``transformer_classes`` contains ``type(transformer).__name__``.

    Raises:
        ValueError: the transformer is not one rotvid supports.
    """
    cls = type(transformer).__name__
    for fam in FAMILIES.values():
        if cls in fam.transformer_classes:
            return fam
    known = sorted(c for f in FAMILIES.values() for c in f.transformer_classes)
    raise ValueError(f"pipe: expected a transformer of class {', '.join(known)}, got {cls}")


def family_by_name(name: str) -> ModelFamily:
    if name not in FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def model_entry(repo_id: str) -> ModelEntry | None:
    """The :data:`MODELS` entry whose ``repo_id`` is ``repo_id`` (exact), or ``None``."""
    for entry in MODELS.values():
        if entry.repo_id == repo_id:
            return entry
    return None


def frame_rate(family: str, repo_id: str | None = None) -> int:
    """Frames per second of ``family``'s videos, or of the checkpoint ``repo_id`` where it has its own.

    Args:
        family: a key of :data:`FAMILIES`.
        repo_id: a diffusers repo id (``None`` or an unknown one: the family's rate).

    Raises:
        ValueError: unknown family, or ``repo_id`` is a known checkpoint of another family.
    """
    fam = family_by_name(family)
    entry = model_entry(repo_id) if repo_id is not None else None
    if entry is None:
        return fam.fps
    if entry.family != fam.name:
        raise ValueError(f"repo_id: {repo_id!r} is a {entry.family} checkpoint, not {fam.name}")
    return entry.fps if entry.fps is not None else fam.fps
