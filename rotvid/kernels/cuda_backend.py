"""``backend="cuda"`` of :func:`rotvid.kernels.attention`: the recipes' CUDA kernels behind one dispatcher backend.

Which recipe has a CUDA kernel, what it checks and how it runs is the recipe's
(:attr:`rotvid.kernels.recipes.base.Recipe.kernels` ``["cuda"]``); this backend asks the registry. The parts of the
CUDA side live by job:

* :mod:`rotvid.kernels.cuda_sources` — which files the extension is built from (the shared ``csrc/`` and each
  recipe's ``csrc/``, found by folder);
* :mod:`rotvid.kernels.cuda_build` — the arch table, building and loading the extension;
* :mod:`rotvid.kernels.cuda_layout` — the operand layout the kernels share, shared input checks;
* :mod:`rotvid.kernels.cuda_checks` — the support checks the recipes' kernel entries list;
* :mod:`rotvid.kernels.recipes.int4.ops`, :mod:`rotvid.kernels.recipes.int8_fp8.ops` — each recipe's custom ops
  (``rotvid::int4_*``, ``rotvid::int8fp8_*``) with their fake implementations, the functions on them, its operands'
  layout and the packing of the reference's operands into it (for tests); its sources are in its folder's ``csrc/``;
* :mod:`rotvid.kernels.rope_op` — the RoPE·R op (``rotvid::generalized_rope``) and the CUDA / Triton / PyTorch
  choice for it.
"""

from __future__ import annotations

from rotvid.kernels.cuda_build import _nvcc, arch_entry
from rotvid.kernels.recipes import recipes
from rotvid.kernels.recipes.registry import get_recipe

NAME = "cuda"


class CudaBackend:
    """``backend="cuda"`` of :func:`rotvid.kernels.attention`: every registered recipe with a ``"cuda"`` kernel
    entry (the INT4 recipes, and int8-fp8 on sm89 / sm90, with the arch default kernel: wgmma on sm90, mma.sync on
    sm89). Every kernel takes a block map (the wgmma kernels on sm90, the mma.sync ones elsewhere). The int8-fp8 wgmma
    kernel (sm90) returns each row's log-sum-exp on request (``return_lse``: ring attention); the other kernels refuse
    such calls (``KernelEntry.returns_lse``, the int8-fp8 entry's ``lse_on_wgmma`` check). The int8-fp8 call applies
    the online V/O Hadamard itself (``v_hadamard``, :meth:`fuses_v_hadamard`): V rotated by its pre-processing, the
    output turned back inside the call (``KernelEntry.unrotates_output``: the attention kernel's epilogue at head_dim
    128, one pass over the output at 64)."""

    name = NAME

    def availability(self) -> str:
        try:
            arch_entry()
            _nvcc()
        except RuntimeError as err:
            return str(err)
        parts = [entry.describe() for entry in self._entries().values() if entry.describe is not None]
        return f"available ({'; '.join(dict.fromkeys(p for p in parts if p))})"

    @staticmethod
    def _entries():
        return {r.name: r.kernels[NAME] for r in recipes() if NAME in r.kernels}

    def refusal(self, q, k, v, *, recipe, **opts) -> tuple[str, str] | None:
        """``(check name, reason)`` when the recipe's CUDA kernel cannot take the call (``"recipe"`` when it has
        none), else None."""
        entry = get_recipe(recipe).kernel(NAME)
        if entry is None:
            supported = ", ".join(self._entries())
            return "recipe", f"recipe {recipe!r} has no CUDA kernel (supported: {supported})"
        if opts.get("return_lse") and not entry.returns_lse:
            return "return_lse", (f"return_lse=True: recipe {recipe!r}'s CUDA kernel returns no log-sum-exp "
                                  "(ring attention needs it)")
        return entry.refusal(q, k, v, recipe=recipe, **opts)

    def unsupported_reason(self, q, k, v, *, recipe, **opts) -> str | None:
        refused = self.refusal(q, k, v, recipe=recipe, **opts)
        return None if refused is None else refused[1]

    def fuses_rope(self, q, k, rope, *, recipe, layout="BHND") -> bool:
        """True when :meth:`run` applies ``rope`` (RoPE·R) inside the recipe's pre-processing (the int8-fp8 recipe
        with a table its pre-processing accepts); the dispatcher rotates q and k first otherwise."""
        entry = get_recipe(recipe).kernel(NAME)
        return entry is not None and entry.applies_rope(q, k, rope, layout=layout)

    def fuses_v_hadamard(self, q, k, v, block, *, recipe, layout="BHND") -> bool:
        """True when :meth:`run` applies V's side of the online V/O Hadamard of ``block`` inside the recipe's
        pre-processing (``v_hadamard=block``; the int8-fp8 recipe with the block = head_dim, whose kernel turns the
        output back too: ``KernelEntry.unrotates_output``); the dispatcher rotates V in PyTorch first otherwise."""
        entry = get_recipe(recipe).kernel(NAME)
        return entry is not None and entry.applies_v_hadamard(q, k, v, block, layout=layout)

    def run(self, q, k, v, *, recipe, layout="BHND", kv_lens=None, sm_scale=None, smooth_k=True, smooth_q=False,
            smooth_v=False, block_m=None, block_n=None, q_block=None, rope=None, block_map=None, return_lse=False,
            v_hadamard=1):
        """Run a call given by its options, checked here (the recipe's CUDA kernel's checks, then its kernel-level
        entry point's); :func:`rotvid.kernels.dispatch.run_attention` runs a prepared call by :meth:`execute`."""
        why = self.unsupported_reason(q, k, v, recipe=recipe, layout=layout, kv_lens=kv_lens, smooth_q=smooth_q,
                                      block_m=block_m, block_n=block_n, q_block=q_block, block_map=block_map,
                                      return_lse=return_lse)
        if why is not None:
            raise ValueError(f"backend: 'cuda' cannot run this call: {why}")
        entry = get_recipe(recipe).kernel(NAME)
        if rope is not None and not entry.applies_rope(q, k, rope, layout=layout):
            raise ValueError(f"rope: the CUDA backend cannot apply it in the pre-processing of recipe {recipe!r} "
                             "(rotate q and k first: rotvid.kernels.rope_op.apply_generalized_rope)")
        if v_hadamard != 1 and not entry.applies_v_hadamard(q, k, v, v_hadamard, layout=layout):
            raise ValueError(f"v_hadamard: the CUDA backend cannot rotate V in the pre-processing of recipe {recipe!r} "
                             f"with block {v_hadamard} (rotate V first: rotvid.rope.hadamard.rotate_v_online)")
        opts = dict(layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, smooth_k=smooth_k, smooth_q=smooth_q,
                    smooth_v=smooth_v, block_m=block_m, block_n=block_n, q_block=q_block, block_map=block_map)
        if return_lse:  # (only when asked: a kernel without an LSE never sees it)
            opts["return_lse"] = True
        if v_hadamard != 1:  # (likewise: a kernel that never rotates V never sees the option)
            opts["v_hadamard"] = v_hadamard
        return _run_entry(entry.run, q, k, v, rope, opts)

    def execute(self, call, q, k, v, *, rope=None, **overrides):
        """Run a call :func:`rotvid.kernels.dispatch.prepare_attention` prepared for this backend, as decided there:
        its kernel entry (:attr:`~rotvid.kernels.dispatch.AttentionCall.kernel`), checked there once, runs its
        unchecked body (:attr:`~rotvid.kernels.recipes.base.KernelEntry.run_unchecked`), no lookup and no check
        again. ``rope``: a table the entry applies itself (the dispatcher decided it, once), or None; ``overrides``:
        options replacing the prepared ones (``layout``, ``kv_lens``, ``block_map``, ``v_hadamard``)."""
        entry, opts = call.kernel, call.opts.copy()
        opts.update(overrides)
        return _run_entry(entry.run_unchecked or entry.run, q, k, v, rope, opts)


def _run_entry(run, q, k, v, rope, opts):
    """A kernel entry's ``run`` with the call's options as :meth:`CudaBackend.run` has always given them (``q_block``
    and ``block_map`` always, ``return_lse`` and ``v_hadamard`` only when set)."""
    extra = {name: opts[name] for name in ("return_lse", "v_hadamard") if name in opts}
    return run(
        q, k, v, layout=opts["layout"], kv_lens=opts["kv_lens"], sm_scale=opts["sm_scale"], smooth_k=opts["smooth_k"],
        smooth_q=opts["smooth_q"], smooth_v=opts["smooth_v"], block_m=opts["block_m"], block_n=opts["block_n"],
        q_block=opts.get("q_block"), rope=rope, block_map=opts.get("block_map"), **extra,
    )
