"""What one model family is to rotvid: the dataclasses a family module fills in, and nothing else.

A family module (``rotvid/pipelines/families/<name>.py``) builds one :class:`Family` and registers it with one line in
:mod:`rotvid.pipelines.families`. Every other part of rotvid reads the registry: ``apply`` / ``remove`` (the
transformers, block stacks, self-attentions and their processors, the V/O projections), the RoPE tables
(:class:`~rotvid.rope.facts.RopeFacts`), the schedule presets, loading (float32 components), the config-file checks
(:mod:`rotvid.pipelines.pipeline_config`), ``rotvid generate`` (frame rates, default presets, the packages a pipeline
class needs) and the tiny test pipelines (:mod:`rotvid.pipelines.tiny`).

This module imports no diffusers model and no other part of rotvid but the RoPE facts' dataclass (and the tiny
pipelines' text length), so a family module stays light: diffusers classes are named by their class names and
imported only where a tiny pipeline is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from rotvid.pipelines.families.tiny_parts import TEXT_LEN
from rotvid.rope.facts import RopeFacts

__all__ = [
    "BlockStack",
    "ConfigValue",
    "Family",
    "ModelEntry",
    "SchedulePreset",
    "TinyVariant",
    "TASKS",
    "TOKEN_ORDERS",
    "CFG_MODES",
    "LATENT_LAYOUTS",
]

TASKS = ("t2v", "i2v", "ti2v")
TOKEN_ORDERS = ("video", "video,text", "text,video")
CFG_MODES = ("separate", "batched")
LATENT_LAYOUTS = ("BCFHW", "BFCHW")

# ``value(key)``: a component's config value for ``key`` (its file's, else its diffusers class's ``__init__`` default;
# ``None`` when neither has it) -- what :attr:`Family.video_factors` reads (rotvid.pipelines.pipeline_config)
ConfigValue = Callable[[str], Any]


@dataclass(frozen=True)
class BlockStack:
    """One stack of transformer blocks that each hold one self-attention.

    Attributes:
        attr: name of the ``nn.ModuleList`` on the transformer (``"blocks"``, ``"transformer_blocks"``).
        block_classes: class names accepted in that list.
        self_attention: attribute of the block holding the self-attention module (a cross-attention beside it is
            never touched).
        processor: the rotvid processor class installed on that attention (a
            :class:`~rotvid.pipelines.processors.RotvidProcessorBase` mirroring the maths of the diffusers processor
            it replaces, in the family's module).
        v_projections: dotted paths (relative to the block) of the linears that produce V; their
            output rows get ``W·H`` per head. A fused ``to_qkv`` (diffusers ``fuse_projections``)
            is handled by the fusion code itself.
        out_projections: ``(path, columns)`` of the linears that read the attention output;
            ``columns`` is ``"all"`` or ``"inner"`` (only the first ``heads·head_dim`` input
            columns carry attention output, as in a single-stream ``proj_out`` that reads ``cat([attn, mlp])``).
    """

    attr: str
    block_classes: tuple[str, ...]
    self_attention: str
    processor: type
    v_projections: tuple[str, ...]
    out_projections: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ModelEntry:
    """A released checkpoint: friendly short name -> diffusers repo id, family, schedule preset.

    ``fps``: the checkpoint's frame rate where it differs from its family's
    (:attr:`Family.fps`); ``None`` means the family's. ``bundled``: the model ships inside
    the rotvid package and ``repo_id`` is its folder there (loaded locally, never from the hub).
    """

    name: str
    repo_id: str
    family: str
    task: str
    preset: str | None = None
    fps: int | None = None
    bundled: bool = False


@dataclass(frozen=True)
class SchedulePreset:
    """A named FP16-fallback schedule (:class:`rotvid.pipelines.schedule.Schedule` fields): FP16 for the first / last
    denoising steps and the first / last blocks of each stack. ``source``: where the numbers come from."""

    name: str
    fp16_first_steps: int
    fp16_last_steps: int
    fp16_first_blocks: int
    fp16_last_blocks: int
    source: str


@dataclass(frozen=True)
class TinyVariant:
    """A tiny random pipeline of the family, for tests and smoke runs (:mod:`rotvid.pipelines.tiny`).

    Attributes:
        name: the name ``build_tiny_pipeline`` takes (``"wan"``, ``"wan2.2"``, ...).
        pipeline_class: the diffusers pipeline class (a name in ``diffusers``).
        components: ``(num_layers, seed) -> {component name: module}`` with random weights, built offline.
        call_defaults: JSON-serializable call arguments the folder's ``rotvid_tiny.json`` adds to the size and text
            length every tiny pipeline gets (e.g. a prompt template sized for the tiny tokenizer).
        max_sequence_length: the text length of the tiny calls (``max_sequence_length``), ``None`` for a pipeline
            whose call has no such argument.
        pipeline_attributes: int attributes the pipeline class sets in its ``__init__`` that size the sequence
            (text lengths, image tokens), set on the loaded pipeline from the folder's ``rotvid_tiny.json``.
        call_kwargs: the tests' call arguments beyond those (guidance, negative prompt).
        takes_image: the pipeline is image-to-video: the tests pass a random conditioning image.
    """

    name: str
    pipeline_class: str
    components: Callable[[int, int], dict]
    call_defaults: Mapping[str, Any] = field(default_factory=dict)
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)
    takes_image: bool = False
    max_sequence_length: int | None = TEXT_LEN
    pipeline_attributes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """Everything rotvid knows about one diffusers video model family.

    Attributes:
        name: the family's key in the registry (``"wan"``, ``"hunyuan_video"``, ...).
        transformer_classes: class names of the denoiser.
        transformer_attrs: pipeline attributes that may hold a denoiser (in this order); missing
            or ``None`` ones are skipped (Wan2.2 A14B has two experts: ``transformer``, ``transformer_2``).
        stacks: the block stacks, in execution order (global block index runs across them).
        rope: the family's 3D RoPE facts, or ``None`` (no RoPE: R alone on every token).
        rope_config_attr: transformer config attribute that overrides the segment sizes
            (HunyuanVideo's ``rope_axes_dim``), or ``None``.
        token_order: order of the joint self-attention sequence: ``"video"`` (video only),
            ``"video,text"`` or ``"text,video"``. RoPE covers the video tokens; text tokens get the rotation alone.
        cfg_mode: ``"separate"`` (cond and uncond are two forwards per step) or ``"batched"`` (one forward on a
            doubled batch).
        fps: frame rate (frames per second) of the videos the family was trained on; a checkpoint that differs
            says so in its :class:`ModelEntry`.
        pipeline_prefix: the class-name prefix of the family's diffusers pipelines (a local folder's
            ``model_index.json`` class tells its family by the longest prefix that matches).
        check_inputs_multiple: height and width must be multiples of this in the pipelines' own ``check_inputs``
            (1: they check none).
        video_factors: ``(vae value, transformer value) -> (spatial factor, temporal factor, latent frames
            multiple)`` from the pipeline's config files (:data:`ConfigValue`; ``None`` for an unknown factor).
        float32_components: pipeline components kept in float32 by ``load_pipeline``.
        context_parallel: diffusers ships a context-parallel plan (``_cp_plan``) for the family's
            transformer, so rotvid runs it under Ulysses context parallelism.
        rope_switch_config_attr: transformer config attribute that turns RoPE on, or ``None`` when the family
            always has RoPE.
        rope_max_config_attr: transformer config attribute bounding the RoPE table's positions per axis, or
            ``None`` (no limit known).
        latent_layout: the layout of the transformer's ``hidden_states`` input: ``"BCFHW"`` or ``"BFCHW"``;
            patchified by the config's ``patch_size`` (a (t, h, w) tuple, or h = w with ``patch_size_t``) and
            flattened frame-major into the video tokens.
        text_arguments: the transformer forward's arguments whose tokens join the self-attention sequence (each
            [B, L, C], placed by ``token_order``; their lengths add up), empty when text enters through
            cross-attention only.
        first_frame_pipelines: pipeline classes whose first latent frame is the conditioning image: its tokens count
            as conditioning tokens of the static block maps.
        default_presets: ``(task, schedule preset name)`` for a pipeline of the family that is not a named
            checkpoint (a task not listed: ``"none"``).
        schedule_presets: the family's named FP16-fallback schedules.
        pipeline_requirements: ``(pipeline class, packages)``: packages a pipeline class imports only when
            available but then calls unconditionally (one clear error before a run, not a ``NameError``).
        models: the family's released checkpoints (friendly short names).
        tiny: the family's tiny random pipelines.
    """

    name: str
    transformer_classes: tuple[str, ...]
    transformer_attrs: tuple[str, ...]
    stacks: tuple[BlockStack, ...]
    rope: RopeFacts | None
    rope_config_attr: str | None
    token_order: str
    cfg_mode: str
    fps: int
    pipeline_prefix: str
    check_inputs_multiple: int
    video_factors: Callable[[ConfigValue, ConfigValue], tuple[Any, Any, int]]
    float32_components: tuple[str, ...] = ()
    context_parallel: bool = False
    rope_switch_config_attr: str | None = None
    rope_max_config_attr: str | None = None
    latent_layout: str = "BCFHW"
    text_arguments: tuple[str, ...] = ()
    first_frame_pipelines: tuple[str, ...] = ()
    default_presets: tuple[tuple[str, str], ...] = ()
    schedule_presets: tuple[SchedulePreset, ...] = ()
    pipeline_requirements: tuple[tuple[str, tuple[str, ...]], ...] = ()
    models: tuple[ModelEntry, ...] = ()
    tiny: tuple[TinyVariant, ...] = ()

    @property
    def rope_family(self) -> str:
        """The name the family's RoPE facts go by (its own name)."""
        return self.name

    def default_preset(self, task: str) -> str:
        """The schedule preset of a pipeline of this family doing ``task`` that is not a named checkpoint."""
        return dict(self.default_presets).get(task, "none")

    def check(self) -> None:
        """ValueError naming the first field that is not what the registry needs."""
        def bad(field: str, expected: str, got) -> ValueError:
            return ValueError(f"family {self.name!r}: {field}: expected {expected}, got {got!r}")

        if not isinstance(self.name, str) or not self.name.replace("_", "").isalnum():
            raise bad("name", "a name of letters, digits and underscores", self.name)
        if not self.transformer_classes or not self.transformer_attrs or not self.stacks:
            raise bad("transformer_classes / transformer_attrs / stacks", "at least one each",
                      (self.transformer_classes, self.transformer_attrs, self.stacks))
        if self.token_order not in TOKEN_ORDERS:
            raise bad("token_order", f"one of {TOKEN_ORDERS}", self.token_order)
        if self.cfg_mode not in CFG_MODES:
            raise bad("cfg_mode", f"one of {CFG_MODES}", self.cfg_mode)
        if self.latent_layout not in LATENT_LAYOUTS:
            raise bad("latent_layout", f"one of {LATENT_LAYOUTS}", self.latent_layout)
        if (self.token_order == "video") != (not self.text_arguments):
            raise bad("text_arguments", f"arguments exactly when token_order is not 'video' ({self.token_order!r})",
                      self.text_arguments)
        if self.rope is not None and self.rope.family != self.name:
            raise bad("rope.family", repr(self.name), self.rope.family)
        if not isinstance(self.fps, int) or self.fps <= 0:
            raise bad("fps", "a positive int", self.fps)
        for stack in self.stacks:
            if not isinstance(stack.processor, type):
                raise bad(f"stacks[{stack.attr}].processor", "a processor class", stack.processor)
        for task, _ in self.default_presets:
            if task not in TASKS:
                raise bad("default_presets", f"tasks in {TASKS}", task)
        for entry in self.models:
            if entry.family != self.name or entry.task not in TASKS:
                raise bad(f"models[{entry.name}]", f"family {self.name!r} and a task in {TASKS}",
                          (entry.family, entry.task))
