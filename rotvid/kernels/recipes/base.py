"""What a recipe is: :class:`Recipe`, its per-backend :class:`KernelEntry`, and the checks a kernel runs.

A recipe is everything rotvid knows about one attention numerics in one frozen object: its name, the labels the
reports use, its default Q/V smoothing, its key-block size per backend, its reference function (the exact model of
its kernels, any device), its kernels per backend (each with a list of small named support checks, the
``attention_dispatch`` constraint style of diffusers: the first check that returns a reason refuses the call, and
the dispatcher can say which one), and its rows of the per-GPU ``recipe="auto"`` table.

The recipes themselves live one per folder beside this one; :mod:`rotvid.kernels.recipes` is their registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import torch

__all__ = ["Check", "KernelEntry", "Recipe", "RecipeLabels", "first_refusal"]

# A support check: ``check(q, k, v, **opts) -> None`` when the kernel can take the call, else the reason (one line).
# ``opts`` are the call's options (recipe, layout, kv_lens, smooth_q, q_block, block_m, block_n, ...). Checks read
# shapes, strides, dtypes and host facts only, so under torch.compile their answer is a constant of the graph.
Check = Callable[..., "str | None"]


def first_refusal(checks, q, k, v, **opts) -> tuple[str, str] | None:
    """``(check name, reason)`` of the first check in ``checks`` that refuses the call, or None when all accept."""
    for check in checks:
        reason = check(q, k, v, **opts)
        if reason:
            return check.__name__, reason
    return None


@dataclass(frozen=True)
class KernelEntry:
    """A recipe's kernel on one backend.

    Attributes:
        run: ``run(q, k, v, *, layout, kv_lens, sm_scale, smooth_k, smooth_q, smooth_v, block_n, rope, block_map)``
            -> the output in q's shape, layout and dtype (only called after every check accepted the call; a kernel
            that takes no block map refuses one in its checks).
        checks: the support checks, in order (:func:`first_refusal`).
        block_n: the key-block size it uses when a call gives none, as a function of the device.
        fuses_rope: ``fuses_rope(q, k, rope, layout=...)`` -> "" when ``run`` applies a RoPE·R table itself
            (inside its pre-processing), else why not; None: it never does (the dispatcher rotates q and k first).
        describe: a few words for ``rotvid backends`` on where it runs (optional).
        returns_lse: whether ``run`` takes ``return_lse=True`` and then returns ``(out, lse)`` (the reference's
            LSE convention, :mod:`rotvid.kernels.reference`); False: the CUDA backend refuses such calls (check name
            ``"return_lse"``) before any work. A kernel that returns it on some GPUs only refuses the others in its
            ``checks``.
        fuses_v_hadamard: ``fuses_v_hadamard(q, k, v, block, layout=...)`` -> "" when ``run`` applies V's side of the
            online V/O Hadamard of ``block`` itself (``run(..., v_hadamard=block)`` then attends the bits of
            :func:`rotvid.rope.hadamard.rotate_v_online` and returns that attention, still rotated), else why not;
            None: it never does (the dispatcher rotates V in PyTorch first). Either way
            :func:`rotvid.kernels.dispatch.unrotate_output` undoes the rotation on the output -- unless
            ``unrotates_output``.
        unrotates_output: with ``fuses_v_hadamard``: ``run(..., v_hadamard=block)`` also turns the output back itself
            (the int8-fp8 call: in its attention kernel's epilogue at head_dim 128, by one pass at 64) and returns
            the attention of ``v``, not the rotated one;
            :func:`rotvid.kernels.dispatch.unrotate_output` then leaves it as it is.
        run_unchecked: ``run`` without the kernel-level entry point's input checks, what a prepared call runs
            (:meth:`rotvid.kernels.cuda_backend.CudaBackend.execute`: :func:`rotvid.kernels.dispatch.prepare_attention`
            checked the inputs and ran ``checks`` once; ``rope`` only a table ``fuses_rope`` accepted). The same
            bits as ``run``. None: the prepared call runs ``run``.
    """

    run: Callable[..., torch.Tensor]
    checks: tuple[Check, ...]
    block_n: Callable[[torch.device | None], int]
    fuses_rope: Callable[..., str] | None = None
    describe: Callable[[], str] | None = None
    returns_lse: bool = False
    fuses_v_hadamard: Callable[..., str] | None = None
    unrotates_output: bool = False
    run_unchecked: Callable[..., torch.Tensor] | None = None

    def refusal(self, q, k, v, **opts) -> tuple[str, str] | None:
        """``(check name, reason)`` when this kernel cannot take the call, else None."""
        return first_refusal(self.checks, q, k, v, **opts)

    def applies_rope(self, q, k, rope, *, layout: str = "BHND") -> bool:
        """True when ``run`` applies the RoPE·R table ``rope`` itself (:attr:`fuses_rope` accepts it)."""
        return self.fuses_rope is not None and not self.fuses_rope(q, k, rope, layout=layout)

    def applies_v_hadamard(self, q, k, v, block: int, *, layout: str = "BHND") -> bool:
        """True when ``run`` rotates V by the online V/O Hadamard of ``block`` itself (:attr:`fuses_v_hadamard`)."""
        return self.fuses_v_hadamard is not None and not self.fuses_v_hadamard(q, k, v, block, layout=layout)


@dataclass(frozen=True)
class RecipeLabels:
    """What reports print for a recipe: the paper's Table-1 columns ``datatype`` and ``optim_p`` (range-optimized
    P: "✓", symmetric P: "×", not applicable: "–")."""

    datatype: str
    optim_p: str = "–"


def _frozen(mapping) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Recipe:
    """One attention recipe (see the module docstring).

    Attributes:
        name: what configs, the CLI and reports call it (``int4``, ``int8-fp8``, ...).
        summary: one line for docs and ``--help``.
        labels: :class:`RecipeLabels` for the reports.
        quantized: False for the recipe that runs the model's own attention (``fp16``): a pipeline then never calls
            a rotvid kernel, and the schedule is not consulted.
        smooth_q / smooth_v: the recipe's default Q / V smoothing (a config's ``None``); K is smoothed by default
            for every recipe (``RotvidConfig.smooth_k``).
        reference: ``reference(q, k, v, *, layout, kv_lens, sm_scale, block_m, block_n, smooth_k, smooth_q,
            smooth_v, q_block[, block_map])`` -> the output in q's shape, layout and dtype (``sm_scale`` already
            resolved). ``block_map`` (a :class:`rotvid.kernels.sparsity.BlockMap`) is passed only when a call has
            one; the built-in references all take it (:func:`rotvid.kernels.reference.attention_blockwise`).
            ``return_lse=True`` likewise, only when a call asks: it then returns ``(out, lse)``, the per-row
            log-sum-exp of the unsmoothed scores (:mod:`rotvid.kernels.reference`; ring attention merges by it).
        reference_lse: whether ``reference`` takes ``return_lse`` (True for every reference built on
            :func:`~rotvid.kernels.reference.attention_blockwise` or
            :func:`~rotvid.kernels.recipes.int4.reference.attention_int4`; False: the reference backend refuses calls
            that ask for the LSE).
        reference_block_n: the key-block size of the reference backend when a call gives none.
        kernels: backend name -> :class:`KernelEntry` (``"cuda"``: rotvid's CUDA kernels).
        auto_on: compute capability -> why ``recipe="auto"`` picks this recipe on that GPU.
        auto_elsewhere: when set, ``auto`` picks this recipe on the CPU and on GPUs no recipe claims, for this
            reason (exactly one registered recipe sets it).
        requested_notes: compute capability -> what a config asking for this recipe by name is told there
            ("" or absent: nothing).
    """

    name: str
    summary: str
    labels: RecipeLabels
    quantized: bool
    smooth_q: bool
    smooth_v: bool
    reference: Callable[..., torch.Tensor]
    reference_block_n: int
    kernels: Mapping[str, KernelEntry] = field(default_factory=dict)
    auto_on: Mapping[tuple[int, int], str] = field(default_factory=dict)
    auto_elsewhere: str = ""
    requested_notes: Mapping[tuple[int, int], str] = field(default_factory=dict)
    reference_lse: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == "auto" or ":" in self.name:
            raise ValueError(f"name: expected a non-empty recipe name other than 'auto', without ':', got {self.name!r}")
        for attr in ("quantized", "smooth_q", "smooth_v", "reference_lse"):
            if not isinstance(getattr(self, attr), bool):
                raise ValueError(f"{attr}: expected True or False, got {getattr(self, attr)!r}")
        if not callable(self.reference):
            raise ValueError(f"reference: expected a function, got {self.reference!r}")
        for attr in ("kernels", "auto_on", "requested_notes"):
            object.__setattr__(self, attr, _frozen(getattr(self, attr)))

    def kernel(self, backend: str) -> KernelEntry | None:
        """This recipe's kernel on ``backend`` (None: it has none there)."""
        return self.kernels.get(backend)

    def default_block_n(self, backend: str, device: torch.device | None = None) -> int:
        """The key-block size ``backend`` uses for this recipe when a call gives none (part of the numerics)."""
        entry = self.kernels.get(backend)
        return entry.block_n(device) if entry is not None else self.reference_block_n

    def smoothing(self, smooth_q: bool | None, smooth_v: bool | None) -> tuple[bool, bool]:
        """``(smooth_q, smooth_v)`` a call runs: each as given, or this recipe's default when None."""
        return (self.smooth_q if smooth_q is None else smooth_q, self.smooth_v if smooth_v is None else smooth_v)
