"""The one public attention entry point: input checks, backend registry, backend choice.

A backend object has a ``name``, ``unsupported_reason(q, k, v, **opts) -> str | None`` (``None`` when it can run
the call) and ``run(q, k, v, **opts) -> Tensor``; ``reference`` and ``cuda`` are built in, others register with
:func:`register_backend`. ``backend="auto"`` tries the accelerated backends in order of preference and falls back
to the reference, logging why. Which recipes a backend runs, and with which checks, is the recipes'
(:mod:`rotvid.kernels.recipes`).

A call is decided once: :func:`prepare_attention` validates it, resolves its recipe, chooses its backend (running the
backend's checks) and returns an :class:`AttentionCall` -- the :class:`~rotvid.kernels.recipes.base.Recipe`, the
backend's :class:`~rotvid.kernels.recipes.base.KernelEntry` for it, the options frozen, the block map --;
:func:`run_attention` runs it (the pipelines' runtime decides between the two whether the call falls back):
a built-in backend executes the prepared call (``execute(call, q, k, v, *, rope=None, **overrides)``) without
looking anything up or checking it again, and a CUDA kernel then runs its unchecked body (the C++ side's checks
still run); a backend registered with :func:`register_backend` gets ``run(q, k, v, **opts)``. :func:`attention` is the
two in one.

``return_lse=True`` (of :func:`attention` and :func:`prepare_attention`) asks a backend for the per-row
log-sum-exp as well (:mod:`rotvid.kernels.reference` defines it); the option reaches a backend only when asked, and
a backend or kernel that cannot return it refuses the call (the reference backend returns it for every built-in
recipe; the CUDA backend for the kernels whose entry says ``returns_lse``).

The online V/O Hadamard (``v_hadamard=block`` of :func:`prepare_attention`; ``vo_hadamard`` of :func:`attention`): the
call attends V' = :func:`rotvid.rope.hadamard.rotate_v_online` (v, block) and :func:`unrotate_output` turns its output
back. Where it runs is decided once, with the backend: a backend whose kernel rotates V in its own pre-processing
(``fuses_v_hadamard``: the int8-fp8 CUDA recipe, block = head_dim 64 or 128) gets the option and its output goes back
inside the call (``KernelEntry.unrotates_output``: the attention kernel's epilogue at head_dim 128, the butterflies on
the float32 row and one rounding; one CUDA pass at 64; :func:`unrotate_output` then leaves it as it is) or, for a
registered backend that rotates V only, through one CUDA pass (:func:`rotvid.kernels.hadamard_op.vo_hadamard_cuda`); any
other call rotates V in PyTorch before the backend runs and un-rotates in PyTorch after it (the CUDA pass and PyTorch:
the same bits).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Protocol

import torch

from rotvid.kernels import reference
from rotvid.kernels.cuda_backend import CudaBackend
from rotvid.kernels.hadamard_op import vo_hadamard_cuda, vo_hadamard_cuda_unsupported
from rotvid.kernels.recipes import AUTO, get_recipe, int4
from rotvid.kernels.recipes.auto import resolve_recipe
from rotvid.kernels.recipes.base import KernelEntry, Recipe
from rotvid.kernels.rope_op import apply_generalized_rope
from rotvid.kernels.sparsity import BlockMap
from rotvid.rope.fused_table import GeneralizedRopeTable
from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Head dims where every recipe's maths is exact (INT4 integer sums stay far below 2^24).
MAX_HEAD_DIM = 256
AUTO_PREFERENCE = ("cuda",)


class AttentionBackend(Protocol):
    name: str

    def unsupported_reason(self, q, k, v, **opts) -> str | None: ...

    def run(self, q, k, v, **opts) -> torch.Tensor: ...


@dataclass
class ReferenceBackend:
    """The PyTorch reference (:mod:`rotvid.kernels.reference`); runs every recipe on any device."""

    name: str = "reference"

    def unsupported_reason(self, q, k, v, **opts) -> str | None:
        recipe = get_recipe(opts["recipe"]) if opts.get("return_lse") else None
        if recipe is not None and not recipe.reference_lse:
            return f"return_lse=True: recipe {recipe.name!r}'s reference returns no log-sum-exp (reference_lse=False)"
        return None

    def run(self, q, k, v, **opts) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        opts = dict(opts)
        return self._run(get_recipe(opts.pop("recipe")), q, k, v, opts)

    def execute(self, call: AttentionCall, q, k, v, *, rope=None,
                **overrides) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run a prepared call with its resolved recipe (``overrides``: options replacing the prepared ones). ``rope``
        is always None here: the reference applies no table itself, :func:`run_attention` rotates q and k first."""
        opts = call.opts.copy()  # (a dict: copying a read-only mapping's dict is ~5x faster than unpacking it)
        opts.update(overrides)
        del opts["recipe"]
        return self._run(call.recipe, q, k, v, opts)

    @staticmethod
    def _run(recipe: Recipe, q, k, v, opts: dict):
        opts["block_m"] = opts.get("block_m") or reference.DEFAULT_BLOCK_M
        # (the recipe's reference key block: int8-fp8's is its kernels' 128, so a fallback keeps their numerics)
        opts["block_n"] = opts.get("block_n") or recipe.reference_block_n
        sm_scale = reference.resolve_sm_scale(opts.pop("sm_scale", None), q.shape[-1])
        return recipe.reference(q, k, v, sm_scale=sm_scale, **opts)


_BACKENDS: dict[str, AttentionBackend] = {"reference": ReferenceBackend(), "cuda": CudaBackend()}


def register_backend(name: str, backend: AttentionBackend) -> None:
    """Register (or replace) a backend under ``name``."""
    _BACKENDS[name] = backend


def registered_backends() -> dict[str, AttentionBackend]:
    return dict(_BACKENDS)


def validate_attention_inputs(q, k, v, *, recipe, layout, kv_lens, block_m=None, block_n=None, sm_scale=None,
                              switches: dict | None = None) -> Recipe:
    """Raise ``ValueError`` naming the argument and what was expected, for any bad input (``switches``: the
    smoothing flags by name, each a bool). Returns the recipe ``recipe`` names."""
    resolved = get_recipe(recipe)  # ValueError naming the registered recipes
    if layout not in reference.LAYOUTS:
        raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor in layout {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: expected dtype float16, bfloat16, float32 or float64, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"k, v: expected the same dtype as q ({q.dtype}), got {k.dtype} and {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"k, v: expected the same device as q ({q.device}), got {k.device} and {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"v: expected the same shape as k {tuple(k.shape)}, got {tuple(v.shape)}")
    qb, qh, qn, qd = reference.to_bhnd(q, layout).shape
    kb, kh, kn, kd = reference.to_bhnd(k, layout).shape
    if (qb, qh, qd) != (kb, kh, kd):
        raise ValueError(
            f"k: expected batch, heads and head_dim equal to q's ({qb}, {qh}, {qd}) in layout {layout}, "
            f"got ({kb}, {kh}, {kd})"
        )
    if qd < 1 or qd > MAX_HEAD_DIM or (qd % 2):
        raise ValueError(f"q: expected an even head_dim in [2, {MAX_HEAD_DIM}], got {qd}")
    if qn < 1 or kn < 1:
        raise ValueError(f"q, k: expected at least one query and one key, got N_q={qn}, N_kv={kn}")
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor) or kv_lens.dim() != 1 or kv_lens.shape[0] != qb:
            raise ValueError(f"kv_lens: expected an integer tensor of shape [{qb}] (one per batch), got {kv_lens!r}")
        if kv_lens.dtype.is_floating_point or kv_lens.dtype == torch.bool:
            raise ValueError(f"kv_lens: expected an integer dtype, got {kv_lens.dtype}")
        # The value range needs a host sync: checked in eager mode only. Under torch.compile
        # the caller checks it on the device (rotvid.pipelines.runtime.key_padding_lengths_on_device).
        if not torch.compiler.is_compiling():
            lo, hi = int(kv_lens.min()), int(kv_lens.max())
            if lo < 1 or hi > kn:
                raise ValueError(f"kv_lens: expected values in [1, {kn}] (N_kv), got min {lo}, max {hi}")
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise ValueError(f"{name}: expected a positive int, got {val!r}")
    reference.check_sm_scale(sm_scale)
    for name, val in (switches or {}).items():
        if not isinstance(val, bool):
            raise ValueError(f"{name}: expected True or False, got {val!r}")
    return resolved


def refusing_check(backend: str, q, k, v, **opts) -> tuple[str, str] | None:
    """Which check of ``backend`` refuses this call and why: ``(check name, reason)``, or None when it can run it.
    A backend without named checks (a ``refusal`` method) answers with the name ``"unsupported_reason"``."""
    chosen = registered_backends().get(backend)
    if chosen is None:
        raise ValueError(f"backend: expected one of {', '.join(sorted(_BACKENDS))}, got {backend!r}")
    refusal = getattr(chosen, "refusal", None)
    if refusal is not None:
        return refusal(q, k, v, **opts)
    why = chosen.unsupported_reason(q, k, v, **opts)
    return None if why is None else ("unsupported_reason", why)


def select_backend(q, k, v, *, backend: str = "auto", **opts) -> tuple[AttentionBackend, str]:
    """Pick the backend for this call. Returns ``(backend, reason)``; raises if a named one cannot run."""
    backends = registered_backends()
    if backend != "auto":
        if backend not in backends:
            raise ValueError(f"backend: expected 'auto' or one of {', '.join(sorted(backends))}, got {backend!r}")
        chosen = backends[backend]
        why_not = chosen.unsupported_reason(q, k, v, **opts)
        if why_not is not None:
            raise ValueError(f"backend: {backend!r} cannot run this call: {why_not}")
        return chosen, f"{backend} (requested)"
    reasons = []
    for name in AUTO_PREFERENCE:
        if name not in backends:
            reasons.append(f"{name}: not installed")
            continue
        why_not = backends[name].unsupported_reason(q, k, v, **opts)
        if why_not is None:
            return backends[name], f"{name} (auto)"
        reasons.append(f"{name}: {why_not}")
    return backends["reference"], "reference (auto; " + "; ".join(reasons) + ")"


@dataclass(frozen=True)
class AttentionCall:
    """A call decided once (:func:`prepare_attention`): validated, its recipe resolved, its backend chosen and its
    kernel entry's checks run; run it with :func:`run_attention`.

    Attributes:
        backend: the backend object; reason: why it was chosen (``"cuda (auto)"``, ``"reference (auto; cuda: ...)"``).
        opts: the call's options as the backend takes them (recipe -- by name --, layout, kv_lens, sm_scale,
            smoothing, tiles; block_map and return_lse when given), read-only.
        v_hadamard: the block of the online V/O Hadamard the call attends V rotated by (1: none).
        v_hadamard_fused: True when the backend rotates V itself (:func:`run_attention` then hands it
            ``v_hadamard``).
        v_hadamard_out_fused: True when its kernel turns the output back as well
            (``KernelEntry.unrotates_output``): :func:`run_attention` returns the attention of v, and
            :func:`unrotate_output` leaves it as it is.
        v_hadamard_cuda: True when the sides that run outside the backend's kernel (O's, and V's too where the
            backend does not rotate it) take the one-pass CUDA transform (the CUDA backend, block = head_dim 64 /
            128, fp16 / bf16); False: PyTorch. The same bits either way.
        recipe: the resolved :class:`~rotvid.kernels.recipes.base.Recipe`.
        kernel: the recipe's :class:`~rotvid.kernels.recipes.base.KernelEntry` on the backend, for a built-in
            backend that runs kernel entries (``cuda``); None elsewhere.
    """

    backend: AttentionBackend
    reason: str
    opts: Mapping
    v_hadamard: int = 1
    v_hadamard_fused: bool = False
    v_hadamard_cuda: bool = False
    recipe: Recipe | None = None
    kernel: KernelEntry | None = None
    v_hadamard_out_fused: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "opts", MappingProxyType(dict(self.opts)))

    @property
    def block_map(self) -> BlockMap | None:
        """The block map the call was prepared with (None: all key blocks)."""
        return self.opts.get("block_map")


def prepare_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    recipe: str,
    layout: str = "BHND",
    backend: str = "auto",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    smooth_q: bool = False,
    smooth_v: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    q_block: int | None = None,
    block_map: BlockMap | None = None,
    return_lse: bool = False,
    v_hadamard: int = 1,
) -> AttentionCall:
    """Validate a call of :func:`attention` (ValueError naming the argument) and choose its backend, once.

    ``recipe`` is a registered recipe (``"auto"`` resolved first: :func:`attention` does). Arguments as
    :func:`attention`'s, but ``rope``, which :func:`run_attention` takes. ``block_map`` is part of the backend choice
    (a backend that cannot take a map refuses the call); a map built per call is given to :func:`run_attention`.
    ``return_lse`` likewise: a backend that returns no LSE refuses the call.

    ``v_hadamard``: the block of the online V/O Hadamard (a power of two dividing head_dim; 1, the default: none).
    The prepared call attends ``rotate_v_online(v, v_hadamard)`` -- its output is that attention, still rotated, which
    :func:`unrotate_output` turns back, unless the kernel did (:attr:`AttentionCall.v_hadamard_out_fused`) -- and
    whether the backend rotates V itself (the module docstring) is decided here, once:
    :attr:`AttentionCall.v_hadamard_fused`. It never refuses a call.
    """
    resolved = validate_attention_inputs(
        q, k, v, recipe=recipe, layout=layout, kv_lens=kv_lens, block_m=block_m, block_n=block_n, sm_scale=sm_scale,
        switches=dict(smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v, return_lse=return_lse))
    opts = dict(
        recipe=recipe, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, smooth_k=smooth_k,
        smooth_q=smooth_q, smooth_v=smooth_v, block_m=block_m, block_n=block_n,
    )
    if q_block is not None:
        if isinstance(q_block, bool) or not isinstance(q_block, int) or q_block < 1:
            raise ValueError(f"q_block: expected a positive int or None, got {q_block!r}")
        if not smooth_q:
            raise ValueError(f"q_block: the Q-smoothing block size, only with smooth_q=True (got q_block={q_block})")
        opts["q_block"] = q_block
    if block_map is not None:  # (only when given: a backend or recipe without maps never sees the option)
        check_block_map(block_map, q, k, layout)
        opts["block_map"] = block_map
    if return_lse:  # (only when asked, as the map: a backend without an LSE never sees the option)
        opts["return_lse"] = True
    if (isinstance(v_hadamard, bool) or not isinstance(v_hadamard, int) or v_hadamard < 1
            or v_hadamard & (v_hadamard - 1) or q.shape[-1] % v_hadamard):
        raise ValueError(f"v_hadamard: expected a power of two dividing head_dim {q.shape[-1]} (1: none), "
                         f"got {v_hadamard!r}")
    chosen, reason = select_backend(q, k, v, backend=backend, **opts)
    # a built-in backend (it executes prepared calls) runs the recipe's kernel entry on it, if any
    kernel = resolved.kernel(chosen.name) if hasattr(chosen, "execute") else None
    fused = cuda_pass = False
    if v_hadamard > 1:
        if kernel is not None:
            fused = kernel.applies_v_hadamard(q, k, v, v_hadamard, layout=layout)
        else:
            fuses = getattr(chosen, "fuses_v_hadamard", None)
            fused = fuses is not None and fuses(q, k, v, v_hadamard, recipe=recipe, layout=layout)
        cuda_pass = fused or (chosen.name == "cuda" and not vo_hadamard_cuda_unsupported(v, v_hadamard))
    out_fused = fused and kernel is not None and kernel.unrotates_output
    return AttentionCall(chosen, reason, opts, v_hadamard, fused, cuda_pass, resolved, kernel, out_fused)


def check_block_map(block_map, q: torch.Tensor, k: torch.Tensor, layout: str) -> None:
    """ValueError naming ``block_map`` unless it is a :class:`~rotvid.kernels.sparsity.BlockMap` that fits this
    call's shapes (its values too, in eager mode) on q's device."""
    if not isinstance(block_map, BlockMap):
        raise ValueError(f"block_map: expected a rotvid.kernels.sparsity.BlockMap or None, got {type(block_map).__name__}")
    if block_map.device != q.device:  # (before the values: they are read on the map's device)
        raise ValueError(f"block_map: on {block_map.device}, expected q's device {q.device}")
    block_map.check(q.shape, k.shape, layout=layout)


def run_attention(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str | None = None,
                  kv_lens=None, rope=None, block_map: BlockMap | None = None
                  ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run a prepared call on ``q, k, v`` (the tensors it was prepared with, or the same tensors in ``layout``, or,
    inside a ``torch.cond`` branch, its operands; ``kv_lens`` likewise replaces the prepared one when given, and
    ``block_map`` the prepared map, e.g. one built per call: the backend refuses it if it takes no maps).
    ``rope``: as :func:`attention`'s. Returns ``(out, lse)`` for a call prepared with ``return_lse=True``. A call
    prepared with ``v_hadamard`` attends the rotated V (inside the backend's pre-processing, or rotated here first)
    and returns that attention, still rotated -- :func:`unrotate_output` turns it back -- or, where the kernel turns
    it back itself (:attr:`AttentionCall.v_hadamard_out_fused`), the attention of v.

    Nothing prepared is looked up or checked again: a built-in backend executes the call as prepared (its kernel
    entry's unchecked body); what arrives here is checked here, once (a new ``block_map``, ``rope``, and whether the
    backend applies ``rope`` itself)."""
    overrides = {}
    if layout is not None:
        overrides["layout"] = layout
    layout = call.opts["layout"] if layout is None else layout
    if kv_lens is not None:
        overrides["kv_lens"] = kv_lens
    if block_map is not None:
        check_block_map(block_map, q, k, layout)
        overrides["block_map"] = block_map
    if not torch.compiler.is_compiling():  # a logging call would break a compiled graph
        logger.debug("attention backend: %s", call.reason)
    if call.v_hadamard_fused:
        overrides["v_hadamard"] = call.v_hadamard
    elif call.v_hadamard > 1:
        v = _vo_side(call, v, "v")  # (a view's layout kept: a BHND view of BNHD memory stays one)
    if rope is not None:
        _check_rope(rope, q, k, layout)
        if not _fuses_rope(call, q, k, rope, layout):
            q, k, rope = _rotate(q, rope, layout), _rotate(k, rope, layout), None
    execute = getattr(call.backend, "execute", None) if call.recipe is not None else None
    if execute is not None:  # (a built-in backend, the call prepared by prepare_attention)
        return execute(call, q, k, v, rope=rope, **overrides)
    opts = call.opts.copy()
    opts.update(overrides)
    if rope is not None:
        opts["rope"] = rope
    return call.backend.run(q, k, v, **opts)


def _fuses_rope(call: AttentionCall, q, k, rope, layout: str) -> bool:
    """Whether the call's backend applies ``rope`` itself (decided once per run, with the table): the prepared kernel
    entry's answer, or a registered backend's ``fuses_rope``."""
    if call.kernel is not None:
        return call.kernel.applies_rope(q, k, rope, layout=layout)
    fuses = getattr(call.backend, "fuses_rope", None)
    return fuses is not None and fuses(q, k, rope, recipe=call.opts["recipe"], layout=layout)


def unrotate_output(call: AttentionCall, out: torch.Tensor) -> torch.Tensor:
    """The online V/O Hadamard's inverse on the output of a call prepared with ``v_hadamard`` (``out`` as
    :func:`run_attention` returned it, or the LSE merge of several such outputs: attention is linear in V, so one
    inverse after the merge does), :func:`rotvid.rope.hadamard.unrotate_o_online` -- in one CUDA pass where the call
    was prepared for it (:attr:`AttentionCall.v_hadamard_cuda`), else in PyTorch; the same bits. ``out`` itself for a
    call without it, and for one whose kernel turned its output back (:attr:`AttentionCall.v_hadamard_out_fused`:
    each chunk's output of a ring attention too, so their merge is the attention of v already)."""
    if call.v_hadamard == 1 or call.v_hadamard_out_fused:
        return out
    return _vo_side(call, out, "o")


def _vo_side(call: AttentionCall, x: torch.Tensor, side: str) -> torch.Tensor:
    """One side of the online V/O Hadamard outside the backend's kernel: the one-pass CUDA transform where the call
    was prepared for it (:attr:`AttentionCall.v_hadamard_cuda`: one read and one write), else PyTorch (float32
    butterflies: 7 passes eagerly, one fused kernel compiled). The same bits either way."""
    if call.v_hadamard_cuda:
        return vo_hadamard_cuda(x, call.v_hadamard, side=side)
    return rotate_v_online(x, call.v_hadamard) if side == "v" else unrotate_o_online(x, call.v_hadamard)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    recipe: str = int4.RECIPE.name,
    layout: str = "BHND",
    backend: str = "auto",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    smooth_q: bool = False,
    smooth_v: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    q_block: int | None = None,
    rope=None,
    block_map: BlockMap | None = None,
    return_lse: bool = False,
    vo_hadamard: int = 1,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Quantized attention ``softmax(q kᵀ · sm_scale) v`` under a recipe, on a chosen backend.

    Args:
        q: [B, H, N_q, D] for ``layout="BHND"`` or [B, N_q, H, D] for ``"BNHD"``; fp16, bf16,
            fp32 or fp64.
        k, v: the same layout with N_kv keys; same dtype and device as q.
        recipe: a registered recipe (:mod:`rotvid.kernels.recipes`): ``fp16`` | ``int4`` (RotateAttention,
            range-optimized P) | ``int4-sym-p`` | ``int8-fp8`` (SageAttention2-8b) | ``int4-fp8``
            (SageAttention2-4b) | ``nvfp4``; or ``auto``: q's device's recipe (:mod:`rotvid.kernels.recipes.auto`).
            The default here is ``int4`` and the smoothing switches are given as they are (no recipe defaults
            applied): this is the kernel-level call; :func:`rotvid.attention` defaults to ``auto`` with the
            recipe's smoothing.
        backend: ``auto`` (CUDA kernel where it runs, else the reference, logged with the
            reason), ``reference`` or ``cuda``.
        kv_lens: optional int tensor [B]: keys ``j >= kv_lens[b]`` are masked (padded keys).
        sm_scale: score scale, default ``D ** -0.5``.
        smooth_k / smooth_q / smooth_v: smoothing switches (see :mod:`rotvid.kernels.reference`).
        block_m / block_n: query / key tile sizes (backend default when None: block_m 128; block_n the recipe's
            (:meth:`~rotvid.kernels.recipes.base.Recipe.default_block_n`): 128 for int8-fp8 on every backend, else
            64 on the reference and 128 with the Hopper wgmma INT4 kernel, 64 on the other INT4 kernels). The
            key-block size is part of the numerics (block-local softmax max, per-block V scales): to reproduce a
            kernel with the reference, pass the same ``block_n``.
        q_block: query rows per Q-smoothing mean; None (default): one mean per head over all query
            rows, the CUDA kernels' Q smoothing (a block size runs on the reference only).
        rope: a :class:`rotvid.rope.fused_table.GeneralizedRopeTable` (RoPE·R): q and k are
            un-rotated and the call attends ``apply_generalized_rope(q, rope)`` and ``(k, rope)``.
            The CUDA backend applies it inside the int8-fp8 pre-processing (same bits, no separate
            pass, :func:`rotvid.kernels.recipes.int8_fp8.ops.rope_fusion_unsupported` says when);
            otherwise q and k are rotated here first (:func:`rotvid.kernels.rope_op.apply_generalized_rope`).
        block_map: a :class:`rotvid.kernels.sparsity.BlockMap` (the key blocks of 128 keys each query tile of 128
            rows visits; :func:`rotvid.kernels.sparsity.build_block_map` builds one from a spec), or None (all).
            A skipped block is exactly a block of ``-inf`` scores; a row that keeps no block gives 0. The
            reference backend takes it, and every CUDA kernel (the Hopper kernels on sm90, the mma.sync ones
            elsewhere; none loads a skipped block).
        return_lse: also return each query row's log-sum-exp ``ln Σ_j exp(sm_scale · q·k_j)`` over the keys it
            attends (natural log, of the unsmoothed scores: K smoothing's shift is added back; ``-inf`` for a row
            that attends none), what ring attention merges partial results by (:mod:`rotvid.kernels.reference`).
            The reference backend returns it for every built-in recipe; the CUDA backend refuses the call where
            its kernel returns none.
        vo_hadamard: the block of the online V/O Hadamard (1, the default: none; a power of two dividing the
            head_dim): the recipe attends ``rotate_v_online(v, vo_hadamard)`` and the output is turned back
            (:func:`unrotate_output`), so the result is the attention of v up to the rounding of the two transforms
            and the recipe's own (``RotvidConfig(vo_hadamard="online")``). The int8-fp8 CUDA call applies both
            sides itself where the block is the head_dim (64, 128): V in its pre-processing, the output in its
            epilogue (128) or one pass inside the call (64); elsewhere both sides run outside the kernel (the CUDA
            pass or PyTorch, with the same bits).

    Returns:
        The output with q's shape, layout and dtype. NaN/Inf in the inputs propagate to NaN in
        the affected rows of that head (nothing is raised). With ``return_lse``: ``(out, lse)``, ``lse`` of shape
        [B, H, N_q] (``"BHND"``) or [B, N_q, H] (``"BNHD"``, diffusers' order), float32 (float64 for float64
        inputs on the reference).
    """
    if recipe == AUTO:
        recipe, _ = resolve_recipe(AUTO, q.device if isinstance(q, torch.Tensor) else None)
    call = prepare_attention(q, k, v, recipe=recipe, layout=layout, backend=backend, kv_lens=kv_lens, sm_scale=sm_scale,
                             smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v, block_m=block_m,
                             block_n=block_n, q_block=q_block, block_map=block_map, return_lse=return_lse,
                             v_hadamard=vo_hadamard)
    res = run_attention(call, q, k, v, rope=rope)
    if return_lse:
        return unrotate_output(call, res[0]), res[1]
    return unrotate_output(call, res)


def _check_rope(rope, q: torch.Tensor, k: torch.Tensor, layout: str) -> None:
    if not isinstance(rope, GeneralizedRopeTable):
        raise ValueError(f"rope: expected a GeneralizedRopeTable or None, got {type(rope).__name__}")
    _, _, nq, d = reference.to_bhnd(q, layout).shape
    nk = reference.to_bhnd(k, layout).shape[2]
    if rope.num_tokens != nq or rope.num_tokens != nk or rope.head_dim != d:
        raise ValueError(
            f"rope: a table for {rope.num_tokens} tokens of head_dim {rope.head_dim}, the call has {nq} queries, "
            f"{nk} keys and head_dim {d}"
        )


def _rotate(x: torch.Tensor, rope, layout: str) -> torch.Tensor:
    out = apply_generalized_rope(reference.to_bhnd(x, layout), rope)
    return out if layout == "BHND" else out.transpose(1, 2)  # (a view: the backends take strided layouts)


def describe_backends() -> dict[str, str]:
    """For each known backend, 'available' or why it is not (for `rotvid backends`)."""
    out = {}
    backends = registered_backends()
    for name in ("reference", *AUTO_PREFERENCE):
        if name not in backends:
            out[name] = "not installed"
            continue
        probe = getattr(backends[name], "availability", None)
        out[name] = probe() if callable(probe) else "available"
    return out
