"""``apply(pipe, config)`` / ``remove(pipe)``: attach rotvid to a diffusers video pipeline and take it off.

``apply``:

1. finds the pipeline's transformer(s) (Wan2.2 A14B: ``transformer`` and ``transformer_2``) and
   their family in the registry (:mod:`rotvid.pipelines.families`);
2. for every block of every stack, replaces the processor of the **self**-attention module
   (``attn.set_processor``) with the family's rotvid processor; cross-attention (Wan's
   ``attn2``: text and image context) and HunyuanVideo's text token-refiner are left as they are;
3. touches no weight: the per-head V/O Hadamard is off by default, and runs online with
   ``vo_hadamard="online"`` (V·H into each quantized call, its inverse on the output,
   :mod:`rotvid.pipelines.runtime`); only ``vo_hadamard="fused"`` fuses it into W_v / W_o (:func:`rotvid.rope.hadamard.fuse_v_hadamard`), keeping a
   CPU copy of every touched parameter so that ``remove`` restores them bit for bit;
4. builds the Q/K rotation per block (:func:`rotvid.rope.rotations.make_rotation`; per-block
   learned files are ``select``-ed by block index);
5. wraps the scheduler for the step tracker and hooks the transformers' forwards (and the context-parallel
   checks when ``enable_parallelism`` came after ``apply``);
6. with ``compile=...``, compiles the transformers in place (:mod:`rotvid.pipelines.compiling`);
7. puts the forward guard in front of each transformer (:mod:`rotvid.pipelines.forward_guard`: the
   finiteness check and redo, the forward counts, a swapped scheduler followed);
8. returns a :class:`RotvidHandle` with the run report.

``remove`` undoes all of it: original processors, original weights (bit-identical), no hooks,
no call counters, and no compile when ``apply`` compiled.

diffusers' contract while applied
---------------------------------
* The weights are the user's. With ``vo_hadamard="off"`` (the default) or ``"online"`` no parameter is
  changed, so whatever a user does to the model while rotvid is applied -- LoRAs loaded, fused, switched or
  unloaded before or after ``apply``, ``load_state_dict``, sequential / group offloading, dtype casts,
  ``save_pretrained`` -- gives what it gives without rotvid.
* ``vo_hadamard="fused"`` rewrites ``to_v`` / ``to_out`` / ``add_v_proj`` / ``to_add_out`` / ``proj_out``
  while applied. Then ``state_dict()`` / ``save_pretrained()`` still give the model's own weights (a
  state-dict hook puts back what ``remove`` would restore, in each live parameter's dtype), and every change
  to those weights is refused with one error: ``load_state_dict`` with any of their keys raises at once, and
  a LoRA or other adapter layer put in their place, an in-place write (``fuse_lora``, ``copy_``) or an
  offloading hook that replaces them raises at the next forward and at ``remove`` (which then leaves those
  weights as they are). A LoRA loaded before ``apply`` makes a fused ``apply`` fail, naming the layer.
* ``fuse_qkv_projections()`` on the pipeline or transformer while applied raises (it would replace
  or bypass rotvid's processors); so does the next forward after any other replacement of a rotvid
  processor (``set_attn_processor``).
* A head_dim that is not a power of two gets a block-diagonal V/O Hadamard (the largest power of
  two dividing it, :func:`rotvid.rope.hadamard.vo_hadamard_block`); an odd one gets none. The run
  report's ``notes`` say so.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from rotvid.kernels.recipes import get_recipe
from rotvid.kernels.recipes.auto import resolve_recipe
from rotvid.pipelines.compiling import compile_options, compile_transformers, uncompile_transformers
from rotvid.pipelines.config import RotvidConfig
from rotvid.pipelines.context_parallel import check_context_parallel
from rotvid.pipelines.forward_guard import ForwardGuard
from rotvid.pipelines.families import FAMILIES, families
from rotvid.pipelines.families.base import BlockStack, Family
from rotvid.pipelines.model_table import family_of_transformer
from rotvid.pipelines.qk_rotation import QKRotator
from rotvid.pipelines.report import RunReport
from rotvid.pipelines.runtime import AttentionSite, Runtime
from rotvid.pipelines.step_tracker import StepTracker
from rotvid.pipelines.token_grid import forward_token_grid
from rotvid.rope.hadamard import FUSED_ATTR, fuse_v_hadamard, unfuse_v_hadamard, unfused_v_hadamard_values, vo_hadamard_block
from rotvid.rope.rotations import Rotation, make_rotation

__all__ = ["apply", "remove", "RotvidHandle", "find_transformers"]

logger = logging.getLogger(__name__)

HANDLE_ATTR = "_rotvid_handle"
# Methods shadowed on the pipeline and its transformers while rotvid is applied (they raise).
_REFUSED_METHODS = ("fuse_qkv_projections",)


@dataclass
class _Installed:
    """What ``apply`` changed on one self-attention (to undo it)."""

    attn: nn.Module
    original_processor: object
    head_dim: int
    output_projection: nn.Linear | None
    vo_fused: bool
    snapshots: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (live param, CPU copy)
    # vo_fused: what the fusion left, to refuse later changes: (block, path, linear, [(name, param, version)])
    watch: list[tuple[nn.Module, str, nn.Module, list[tuple[str, torch.Tensor, int]]]] = field(default_factory=list)
    processor: object = None  # the rotvid processor installed
    transformer: str = ""


class RotvidHandle:
    """What ``apply`` returns: the run report, the step tracker, and ``remove``.

    Attributes:
        config: the :class:`RotvidConfig` applied, with ``recipe="auto"`` resolved (the report
            keeps the requested recipe and the reason of the choice).
        family: the :class:`~rotvid.pipelines.families.base.Family` of the pipeline.
        transformers: ``{pipeline attribute: transformer}`` rotvid is attached to.
        tracker: the :class:`StepTracker` (call ``tracker.begin(n)`` / ``set_step(i)`` when
            driving a bare transformer; without a tracked run, calls follow the schedule's block rules only).
        report: the :class:`RunReport` (counts since apply or :meth:`reset_report`; reading it
            brings it up to date with the device-side counters).
    """

    def __init__(self, target, config: RotvidConfig, family: Family, transformers: dict[str, nn.Module],
                 *, recipe_requested: str | None = None, recipe_reason: str = ""):
        self.target = target
        self.config = config
        self.family = family
        self.transformers = transformers
        self.tracker = StepTracker()
        self._report = RunReport(recipe=config.recipe, backend_requested=config.backend,
                                 recipe_requested=recipe_requested or config.recipe, recipe_reason=recipe_reason)
        self.runtime = Runtime(config, self.tracker, self._report)
        self._installed: list[_Installed] = []
        self._hooks: list = []
        self._scheduler = None
        self._guards: dict[str, ForwardGuard] = {}
        self._refused: list[tuple[object, str]] = []  # (object, method name) shadowed by a refusal
        self.compiled: list[str] = []  # transformers apply compiled (remove un-compiles them)
        self.active = True

    @property
    def report(self) -> RunReport:
        if self.active:
            self.runtime.drain_counts()
        return self._report

    @property
    def quantized_fraction(self) -> float:
        """Fraction of self-attention calls that ran the quantized recipe so far."""
        return self.report.quantized_fraction

    @property
    def int4_fraction(self) -> float:
        """Deprecated: the old name of :attr:`quantized_fraction` (kept for one version)."""
        warnings.warn("RotvidHandle.int4_fraction is deprecated (it is the quantized fraction for every recipe): "
                      "use quantized_fraction", DeprecationWarning, stacklevel=2)
        return self.quantized_fraction

    def reset_report(self) -> None:
        self.report.reset()  # drains first: the pending counts are dropped too

    def remove(self) -> None:
        """Same as :func:`remove` on the pipeline."""
        remove(self.target)

    # ---- per forward (the forward guard, outside any compiled graph) ----------------------------
    def before_forward(self, name: str, module: nn.Module, args: tuple = (), kwargs: dict | None = None) -> None:
        """Follow a swapped scheduler, check rotvid's processors are in place, count the forward, and prepare the
        static block maps of its token grid (``args`` / ``kwargs``: the forward's inputs)."""
        if not isinstance(self.target, nn.Module):
            current = getattr(self.target, "scheduler", None)
            if current is not None and current is not self._scheduler:
                self.tracker.follow(current)
                self._scheduler = current
        for inst in self._installed:
            if inst.transformer == name and inst.attn.processor is not inst.processor:
                raise RuntimeError(
                    f"rotvid: the self-attention processor of {inst.processor.site.key} was replaced after apply "
                    f"(by {type(inst.attn.processor).__name__}; fuse_qkv_projections() or set_attn_processor()), "
                    "which would bypass rotvid. Restore it, or call rotvid.remove(pipe) first."
                )
        changed = [c for inst in self._installed if inst.transformer == name for c in _fused_changes(inst)]
        if changed:
            raise RuntimeError(_fused_changes_message(changed, "refused"))
        tracked = self.tracker.in_run()
        if tracked:
            self.tracker.count_forward(name)
        cache = getattr(module, "_cache_config", None)
        self._report.record_forward(name, tracked=tracked, cache=None if cache is None else type(cache).__name__)
        if self.runtime.static_specs:
            first_frame = type(self.target).__name__ in self.family.first_frame_pipelines
            try:
                grid, device = forward_token_grid(self.family, module, args, kwargs or {}, first_frame=first_frame)
            except ValueError as err:
                self.runtime.begin_forward(name, None, torch.device("cpu"), problem=str(err))
            else:
                self.runtime.begin_forward(name, grid, device)

    def after_forward(self, name: str) -> None:
        """The forward of ``name`` (and any redo of it) is over."""
        self.runtime.end_forward(name)

    def _ensure_guards(self, phase: str = "enter") -> None:
        """Put a guard back in front of a transformer the caller compiled after apply (at each step change)."""
        if phase == "enter":
            for guard in self._guards.values():
                guard.install()

    def fused_parameter_names(self, name: str) -> list[str]:
        """The names in transformer ``name`` of the parameters the fused V/O Hadamard rewrote (none unless
        ``vo_hadamard="fused"``)."""
        names = {id(p): n for n, p in self.transformers[name].named_parameters(remove_duplicate=False)}
        return [names[id(p)] for inst in self._installed if inst.transformer == name and inst.vo_fused
                for *_, params in inst.watch for _, p, _ in params if id(p) in names]

    def original_state(self, name: str) -> dict[str, torch.Tensor]:
        """``{parameter name in transformer ``name``: the model's own value}`` for every weight the V/O Hadamard
        rewrote: what :func:`remove` restores (the CPU copies of apply, or the arithmetic un-fusion)."""
        transformer = self.transformers[name]
        names = {id(p): n for n, p in transformer.named_parameters(remove_duplicate=False)}
        out: dict[str, torch.Tensor] = {}
        for inst in self._installed:
            if inst.transformer != name or not inst.vo_fused:
                continue
            if inst.snapshots:
                pairs = [(live, saved.to(live.device)) for live, saved in inst.snapshots]
            else:
                pairs = unfused_v_hadamard_values(inst.attn, output_projection=inst.output_projection)
            for live, value in pairs:
                if id(live) in names:
                    out[names[id(live)]] = value
        return out

    def __repr__(self) -> str:
        n = len(self._installed)
        return f"RotvidHandle(family={self.family.name}, self_attentions={n}, recipe={self.config.recipe}, active={self.active})"


def find_transformers(target) -> tuple[Family, dict[str, nn.Module]]:
    """The family and ``{attribute: transformer}`` of a pipeline, or of a bare transformer.

    Raises:
        ValueError: no supported transformer found, or transformers of different families.
    """
    if isinstance(target, nn.Module):
        return family_of_transformer(target), {"transformer": target}
    found: dict[str, nn.Module] = {}
    family = None
    for attr in dict.fromkeys(a for fam in FAMILIES.values() for a in fam.transformer_attrs):  # the table's order
        module = getattr(target, attr, None)
        if module is None:
            continue
        fam = family_of_transformer(module)
        if family is not None and fam is not family:
            raise ValueError(f"pipe: transformers of different families ({family.name}, {fam.name})")
        if attr not in fam.transformer_attrs:
            raise ValueError(f"pipe: {fam.name} pipelines are not expected to have a {attr!r}")
        family = fam
        found[attr] = module
    if family is None:
        raise ValueError(
            f"pipe: expected a diffusers pipeline of a supported family ({', '.join(FAMILIES)}; with a .transformer) "
            f"or one of their transformers, got {type(target).__name__}"
        )
    return family, found


def _segments_for(family: Family, transformer: nn.Module, head_dim: int) -> tuple[int, ...] | None:
    """RoPE segment sizes for the ``half`` rotation (None: no RoPE, one segment)."""
    cfg = transformer.config
    if family.rope_switch_config_attr is not None and not cfg.get(family.rope_switch_config_attr, False):
        return None
    if family.rope_config_attr is not None and cfg.get(family.rope_config_attr) is not None:
        return tuple(int(s) for s in cfg[family.rope_config_attr])
    if family.rope is None:
        return None
    return family.rope.segments(head_dim)


def _cp_families() -> tuple[str, ...]:
    """The registered families that run under context parallelism (named when another one is asked to)."""
    return tuple(f.name for f in families() if f.context_parallel)


def _rotation_for_block(base: Rotation, block: int, num_blocks: int, expert: int) -> Rotation:
    """A per-block learned rotation's block, or ``base`` itself when it is shared."""
    lead = getattr(base, "lead_shape", ())
    if not lead:
        return base
    if lead[0] == num_blocks:
        return base.select(block)
    if lead[0] % num_blocks == 0 and lead[0] // num_blocks > expert:
        return base.select(expert * num_blocks + block)
    raise ValueError(
        f"rotation: learned rotation has {lead[0]} blocks in its leading dim; expected {num_blocks} "
        f"(one per self-attention) or a multiple for several experts"
    )


def _get(module: nn.Module, path: str) -> nn.Module | None:
    cur = module
    for part in path.split("."):
        cur = cur[int(part)] if part.isdigit() else getattr(cur, part, None)
        if cur is None:
            return None
    return cur


def _vo_linears(block: nn.Module, stack: BlockStack):
    """``(path, layer)`` of every value and output projection of ``block`` that it has (what the fusion rewrites)."""
    for path in list(stack.v_projections) + [p for p, _ in stack.out_projections]:
        lin = _get(block, path)
        if lin is not None:
            yield path, lin


def _snapshot(block: nn.Module, stack: BlockStack) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(p, p.detach().to("cpu", copy=True)) for _, lin in _vo_linears(block, stack)
            for p in (lin.weight, lin.bias) if p is not None]


def _check_attn(attn: nn.Module, where: str) -> None:
    if getattr(attn, "fused_projections", False) or getattr(attn, "to_qkv", None) is not None:
        raise ValueError(
            f"pipe: {where} has fused QKV projections; call transformer.unfuse_qkv_projections() before apply"
        )


def apply(pipe, config: RotvidConfig | None = None, *, exact_remove: bool = True, compile=False) -> RotvidHandle:
    """Attach rotvid to a pipeline (or a bare transformer) in place.

    Args:
        pipe: a diffusers ``WanPipeline`` / ``WanImageToVideoPipeline`` / ``HunyuanVideoPipeline``
            / ``CogVideoXPipeline`` (anything with a supported ``.transformer``), or one of
            their transformers (then drive the step tracker by hand).
        config: the :class:`RotvidConfig` (default: ``RotvidConfig()``, recipe ``auto`` + half
            rotation, no V/O Hadamard, the recipe's smoothing (K always; Q and V for the INT4 recipes), no FP16
            steps/blocks). ``recipe="auto"`` is
            resolved here, once, from the pipeline's execution device
            (:func:`rotvid.kernels.recipes.auto.resolve_recipe`).
        exact_remove: with ``vo_hadamard="fused"`` (the only mode that writes weights), keep a CPU copy of every
            weight the V/O Hadamard rewrites so that
            :func:`remove` restores them bit for bit (memory: W_v and W_o of every block). With
            ``False``, ``remove`` un-fuses arithmetically (exact up to the weights' rounding).
        compile: ``True`` compiles every transformer rotvid is attached to in place with
            ``torch.compile(fullgraph=True)``; a dict passes ``torch.compile`` options
            (``mode``, ``backend``, ``dynamic``, ``options``, ``fullgraph``). See
            :mod:`rotvid.pipelines.compiling`.

    Returns:
        The :class:`RotvidHandle`.

    Raises:
        ValueError: unsupported pipeline, rotvid already applied, fused QKV projections,
            context parallelism rotvid cannot run (a family without a diffusers ``_cp_plan``, ring
            attention, heads not divisible by ``ulysses_degree``: see
            :mod:`rotvid.pipelines.context_parallel`), a rotation that does not fit the model.
    """
    config = RotvidConfig() if config is None else config
    options = compile_options(compile)
    if not isinstance(config, RotvidConfig):
        raise ValueError(f"config: expected a RotvidConfig, got {type(config).__name__}")
    if not isinstance(exact_remove, bool):
        raise ValueError(f"exact_remove: expected True or False, got {exact_remove!r}")
    if getattr(pipe, HANDLE_ATTR, None) is not None:
        raise ValueError("pipe: rotvid is already applied; call rotvid.remove(pipe) first")
    family, transformers = find_transformers(pipe)
    for attr, module in transformers.items():  # applied through another object (the bare transformer, a pipeline)
        if module is not pipe and getattr(module, HANDLE_ATTR, None) is not None:
            raise ValueError(f"pipe: rotvid is already applied to its {attr}; call rotvid.remove() on "
                             "what it was applied to first")
        if any(type(p).__module__.startswith("rotvid.") for p in getattr(module, "attn_processors", {}).values()):
            raise ValueError(f"pipe: its {attr} already runs rotvid, applied through another pipeline that shares "
                             "it; call rotvid.remove() on that pipeline first")
    recipe, recipe_reason = resolve_recipe(config.recipe, _execution_device(pipe, transformers))
    logger.info("rotvid recipe: %s (%s)", recipe, recipe_reason)
    # The recipe and its smoothing are resolved here, once: the runtime and the report read them as they are.
    handle = RotvidHandle(pipe, config.resolved(recipe), family, transformers,
                          recipe_requested=config.recipe, recipe_reason=recipe_reason)
    try:
        _install(handle, exact_remove=exact_remove)
        if options is not None:
            handle.compiled = compile_transformers(handle.transformers, options)
        _install_guards(handle)
    except BaseException:
        _uninstall(handle)
        raise
    if not isinstance(pipe, nn.Module):  # a run the pipeline stops through its _interrupt ends the tracked run
        handle.tracker.interrupted = lambda: bool(getattr(pipe, "_interrupt", False))
    setattr(pipe, HANDLE_ATTR, handle)
    logger.info("rotvid applied: %r", handle)
    return handle


def _execution_device(target, transformers: dict[str, nn.Module]) -> torch.device:
    """Where the self-attention runs: the pipeline's execution device (CPU offload aware), else
    the device of the first transformer parameter, else the CPU."""
    if not isinstance(target, nn.Module):
        dev = getattr(target, "_execution_device", None)
        if dev is not None:
            return torch.device(dev)
    for transformer in transformers.values():
        for param in transformer.parameters():
            return param.device
    return torch.device("cpu")


def check_ring_config(config, ring_degree: int, where: str) -> None:
    """Refuse, before any work, what rotvid cannot run under ring attention (:mod:`rotvid.pipelines.context_parallel`'s docstring).

    Raises:
        ValueError: naming ``sparsity`` (a block map: not split per key chunk), or ``backend`` (``"cuda"`` with a
            recipe whose CUDA kernel returns no log-sum-exp, which every ring call needs).
    """
    specs = [spec for spec in (config.sparsity, *config.schedule.sparsity_specs) if spec.enabled]
    if specs:
        raise ValueError(
            f"sparsity: {where} runs ring attention (ring_degree={ring_degree}), and rotvid does not split block "
            f"maps per key chunk; run {', '.join(dict.fromkeys(str(s) for s in specs))} with Ulysses only "
            f"(ring_degree=1) or dense (sparsity='none')"
        )
    recipe = get_recipe(config.recipe)
    if config.backend == "cuda" and recipe.quantized:
        entry = recipe.kernel("cuda")
        if entry is not None and not entry.returns_lse:
            raise ValueError(
                f"backend: {where} runs ring attention (ring_degree={ring_degree}), which merges each key chunk's "
                f"result by its log-sum-exp, and the CUDA kernel of recipe {recipe.name!r} returns none; use "
                f"Ulysses only (heads divisible by ulysses_degree), or backend='auto' (such calls then run the "
                f"model's own attention, counted as fallbacks)"
            )



def _check_parallel(family: Family, transformer: nn.Module, where: str, config: RotvidConfig) -> None:
    """The context-parallel checks of ``transformer`` (:func:`check_context_parallel`) and, under ring attention,
    of ``config`` (:func:`check_ring_config`)."""
    check_context_parallel(family, transformer, where, cp_families=_cp_families(),
                           check_ring=lambda degree: check_ring_config(config, degree, where))


def _install(handle: RotvidHandle, *, exact_remove: bool) -> None:
    config, family = handle.config, handle.family
    for expert, (tname, transformer) in enumerate(handle.transformers.items()):
        head_dim = int(transformer.config.attention_head_dim)
        _check_parallel(family, transformer, tname, config)
        stacks = []
        for stack in family.stacks:
            blocks = getattr(transformer, stack.attr, None)
            if blocks is None:
                raise ValueError(f"pipe: {tname} has no block list {stack.attr!r}")
            stacks.append((stack, blocks))
        num_blocks = sum(len(b) for _, b in stacks)
        hadamard_block = _vo_hadamard_block(config, handle, tname, head_dim)
        try:
            base_rotation = make_rotation(config.rotation, head_dim, _segments_for(family, transformer, head_dim))
        except ValueError as err:
            raise ValueError(f"rotation: {config.rotation!r} does not fit {tname} (head_dim {head_dim}): {err}") from None
        shared_rotator = QKRotator(base_rotation)
        block = 0
        for si, (stack, blocks) in enumerate(stacks):
            for bi, blk in enumerate(blocks):
                where = f"{tname}.{stack.attr}.{bi}"
                if type(blk).__name__ not in stack.block_classes:
                    raise ValueError(
                        f"pipe: {where} is a {type(blk).__name__}; expected one of {', '.join(stack.block_classes)}"
                    )
                attn = getattr(blk, stack.self_attention)
                _check_attn(attn, f"{where}.{stack.self_attention}")
                rotation = _rotation_for_block(base_rotation, block, num_blocks, expert)
                rotator = shared_rotator if rotation is base_rotation else QKRotator(rotation, fuse=False)
                site = AttentionSite(tname, block, num_blocks, si, bi, len(blocks))
                out_proj = None
                if _lacks_to_out(attn):
                    paths = [p for p, cols in stack.out_projections if cols == "inner"]
                    out_proj = _get(blk, paths[0]) if paths else None
                inst = _Installed(attn, attn.processor, head_dim, out_proj, vo_fused=False, transformer=tname)
                handle._installed.append(inst)
                if config.vo_hadamard == "fused" and hadamard_block > 1:
                    if exact_remove:
                        inst.snapshots = _snapshot(blk, stack)
                    with torch.no_grad():
                        try:
                            fuse_v_hadamard(attn, head_dim, output_projection=out_proj, block=hadamard_block)
                        except ValueError as err:
                            raise ValueError(f"vo_hadamard='fused': {where}: {err}") from None
                    inst.vo_fused = True
                    inst.watch = _watch(blk, stack)
                handle.runtime.add_site(site, attn, rotator)
                inst.processor = stack.processor(handle.runtime, site, rotator, inst.original_processor)
                attn.set_processor(inst.processor)
                block += 1
        handle._report.sites[tname] = num_blocks
        handle._hooks.append(transformer.register_forward_pre_hook(_forward_pre_hook(handle, tname, family)))
        handle._hooks.append(transformer.register_forward_hook(_forward_post_hook(handle)))
        if config.vo_hadamard == "fused":
            handle._hooks.append(transformer.register_state_dict_post_hook(_state_dict_hook(handle, tname)))
            handle._hooks.append(transformer.register_load_state_dict_pre_hook(_load_state_dict_refusal(handle, tname)))
    scheduler = None if isinstance(handle.target, nn.Module) else getattr(handle.target, "scheduler", None)
    if scheduler is not None:
        handle.tracker.attach(scheduler)
        handle._scheduler = scheduler
    for owner in (handle.target, *handle.transformers.values()):
        for method in _REFUSED_METHODS:
            if callable(getattr(owner, method, None)) and method not in vars(owner):
                setattr(owner, method, _refusal(method))
                handle._refused.append((owner, method))


def _watch(block: nn.Module, stack: BlockStack) -> list:
    """What the fusion left on ``block``'s V / output projections: each layer and its parameters' versions."""
    return [(block, path, lin, [(n, p, p._version) for n, p in (("weight", lin.weight), ("bias", lin.bias))
                                if p is not None])
            for path, lin in _vo_linears(block, stack)]


def _fused_changes(inst: _Installed) -> list[str]:
    """What changed since the fusion among ``inst``'s fused weights (a layer replaced, a parameter replaced or
    written in place): one phrase each; empty when nothing did."""
    changes = []
    site = inst.processor.site.key if inst.processor is not None else inst.transformer
    for block, path, lin, params in inst.watch:  # (checked before every forward: the phrases only on a change)
        now = _get(block, path)
        if now is not lin:
            changes.append(f"{site} {path} replaced by {type(now).__module__}.{type(now).__qualname__}")
            continue
        for name, param, version in params:
            if getattr(lin, name, None) is not param:
                changes.append(f"{site} {path}.{name} replaced (an offloading hook or a new parameter)")
            elif param._version != version:
                changes.append(f"{site} {path}.{name} written in place (load_state_dict, fuse_lora, copy_)")
    return changes


def _fused_changes_message(changes: list[str], outcome: str) -> str:
    shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
    return (f"rotvid: vo_hadamard='fused' rewrote the V/O weights while applied, and they were changed since "
            f"({shown}): {outcome}. Change weights before apply or after rotvid.remove(pipe), or apply with "
            "vo_hadamard='off' (the default) or 'online', which touch no weight and compose with LoRAs, "
            "load_state_dict and offloading.")


def _load_state_dict_refusal(handle: RotvidHandle, name: str):
    """Load-state-dict pre hook (fused mode): refuse a state dict that writes a fused V/O weight."""

    def hook(module, state_dict, prefix, *args):
        if not handle.active:
            return
        hit = [prefix + key for key in handle.fused_parameter_names(name) if prefix + key in state_dict]
        if hit:
            raise RuntimeError(_fused_changes_message([f"load_state_dict with {hit[0]}" + (
                f" and {len(hit) - 1} more fused keys" if len(hit) > 1 else "")], "refused"))

    return hook


def _vo_hadamard_block(config: RotvidConfig, handle: RotvidHandle, tname: str, head_dim: int) -> int:
    """The V/O Hadamard block for ``head_dim`` (1: none), with a report note when it is not H_{head_dim}."""
    if config.vo_hadamard == "off":
        return 1
    block = vo_hadamard_block(head_dim)
    if block == 1:
        note = (f"{tname}: no V/O Hadamard (head_dim {head_dim} is odd: no Hadamard block divides it); "
                "vo_hadamard='off' says the same")
    elif block < head_dim:
        note = (f"{tname}: V/O Hadamard block-diagonal, {head_dim // block} blocks of {block} (head_dim {head_dim} "
                "is not a power of two)")
    else:
        return block
    logger.info("rotvid: %s", note)
    handle._report.notes.append(note)
    return block


def _refusal(method: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(
            f"{method}(): rotvid is applied and its self-attention processors would be replaced or bypassed; call "
            f"rotvid.remove(pipe) first (apply refuses fused projections: unfuse before applying again)"
        )

    return refuse


def _state_dict_hook(handle: RotvidHandle, name: str):
    """State-dict post hook: the V/O-Hadamard-fused entries become the model's own weights (module docstring)."""

    def hook(module, state_dict, prefix, local_metadata):
        if not handle.active:
            return
        for key, value in handle.original_state(name).items():
            if prefix + key in state_dict:  # in the live parameter's dtype (a cast model saves one dtype)
                state_dict[prefix + key] = value.to(state_dict[prefix + key].dtype)

    return hook


def _lacks_to_out(attn: nn.Module) -> bool:
    return getattr(attn, "to_out", None) is None


def _forward_pre_hook(handle: RotvidHandle, name: str, family: Family):
    """Checks the scheduler and context parallelism, clears per-forward state; traced by torch.compile, so no
    step reads."""

    def hook(module, args):
        # context parallelism enabled after apply: the same checks as apply's
        _check_parallel(family, module, name, handle.config)
        handle.runtime.clear_forward_state()
        return None

    return hook


def _forward_post_hook(handle: RotvidHandle):
    """Clears per-forward state again, so that a compiled graph leaves none behind (no extra outputs)."""

    def hook(module, args, output):
        handle.runtime.clear_forward_state()
        return None

    return hook


def _install_guards(handle: RotvidHandle) -> None:
    """The forward guards, last (in front of a compile of apply's); followed at each step change."""
    for name, transformer in handle.transformers.items():
        guard = ForwardGuard(handle, name, transformer)
        handle._guards[name] = guard
        guard.install()
    handle.tracker.add_listener(handle._ensure_guards)


def _uninstall(handle: RotvidHandle) -> list[str]:
    """Undo ``apply``; returns the fused V/O weights changed while applied (left as they are)."""
    handle.tracker.remove_listener(handle._ensure_guards)
    for guard in handle._guards.values():
        guard.uninstall()
    handle._guards = {}
    for owner, method in handle._refused:
        vars(owner).pop(method, None)
    handle._refused = []
    handle.runtime.remove_sites()
    uncompile_transformers(handle.transformers, handle.compiled)
    handle.compiled = []
    for hook in handle._hooks:
        hook.remove()
    handle._hooks = []
    handle.tracker.detach()
    handle._scheduler = None
    changed = []
    for inst in reversed(handle._installed):
        inst.attn.set_processor(inst.original_processor)
        if inst.vo_fused:
            problems = _fused_changes(inst)
            if problems:  # the user's change is left as it is (restoring would undo it): remove() says so
                changed.extend(problems)
                vars(inst.attn).pop(FUSED_ATTR, None)  # rotvid's mark goes: the weights are the user's again
            else:
                with torch.no_grad():
                    unfuse_v_hadamard(inst.attn, inst.head_dim, output_projection=inst.output_projection)
                    for live, saved in inst.snapshots:
                        live.copy_(saved)
            inst.vo_fused = False
    handle._installed = []
    handle.active = False
    return changed


def remove(pipe) -> RunReport:
    """Take rotvid off ``pipe``: original processors, original weights, no hooks.

    Returns:
        The final :class:`RunReport` of the handle.

    Raises:
        ValueError: rotvid is not applied to ``pipe``.
    """
    handle = getattr(pipe, HANDLE_ATTR, None)
    if handle is None:
        raise ValueError("pipe: rotvid is not applied to this pipeline (nothing to remove)")
    changed = _uninstall(handle)
    delattr(pipe, HANDLE_ATTR)
    logger.info("rotvid removed")
    if changed:
        raise RuntimeError(_fused_changes_message(changed, "rotvid is removed, and those weights are left as they "
                                                          "are now (the Hadamard is still in the ones not replaced)"))
    return handle.report
