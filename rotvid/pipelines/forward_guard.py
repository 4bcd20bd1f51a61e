"""The per-forward guard: what rotvid does once per transformer forward, outside any compiled graph.

``apply`` puts a :class:`ForwardGuard` in front of each transformer it attaches to, as the module's
``_compiled_call_impl`` — the callable ``nn.Module.__call__`` runs instead of ``_call_impl`` (what
``module.compile()`` sets). The guard calls what was there before (the compiled forward, or the eager
``_call_impl`` with its hooks), so it runs in Python for every forward, compiled or not, and is never
traced. Once per forward it

1. follows a scheduler swapped after ``apply`` (:meth:`~rotvid.pipelines.step_tracker.StepTracker.follow`);
2. checks that rotvid's processors are still installed (``fuse_qkv_projections`` or ``set_attn_processor``
   after ``apply`` would bypass rotvid silently: an error instead);
3. counts the forward (per step while a run is tracked, as untracked otherwise; the report also notes a
   diffusers cache enabled on the transformer), and, with a static block map configured, computes the forward's
   token grid and hands its maps to the runtime (:meth:`~rotvid.pipelines.runtime.Runtime.begin_forward`; they
   are dropped when the forward returns);
4. runs the forward and checks its output with **one** ``isfinite().all()`` reduction (one host sync per
   forward, none per attention call). If the output is not finite while the floating-point inputs are, the
   forward runs again with every self-attention call in FP16 (:attr:`~rotvid.pipelines.runtime.Runtime.redo`)
   and the run continues with that output; the report records the redo with its step, and a redo that is not
   finite either is reported as the model's own. With a diffusers cache enabled, its state is reset before the
   redo (the cache was filled by the non-finite forward), so the redo computes every block.

Under context parallelism (:mod:`rotvid.pipelines.context_parallel`) every decision of step 4 is agreed by the
ranks of the context-parallel mesh (Ulysses, ring, both) before anyone acts on it
(:func:`~rotvid.pipelines.context_parallel.any_rank`: one MAX all-reduce of a 0/1 flag, in place of the host read of
the finiteness check): a redo runs on every rank or on none.
A redo on one rank only would run its all-to-alls alone -- the other ranks wait in the next forward's, or leave --
and the ranks would hang or desynchronise. The rare paths (inputs not finite; the redo's own check) are agreed the
same way, so every rank records the same redo.

A ``module.compile()`` by the caller after ``apply`` replaces the guard; it is put back in front of the new
compiled forward at the next step change (the pipeline's ``set_timesteps`` comes before its first forward).
Wrapping the transformer as ``torch.compile(transformer)`` instead traces ``Module.__call__`` and with it the
guard, which then only forwards (no finiteness check, no forward count): compile with
``apply(..., compile=True)`` or ``transformer.compile()`` to keep them.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from rotvid.pipelines.context_parallel import any_rank, context_parallel_groups

__all__ = ["ForwardGuard", "first_tensor", "all_finite"]

logger = logging.getLogger(__name__)


def first_tensor(output) -> torch.Tensor | None:
    """The sample a transformer returned: the tensor itself, ``output[0]`` of a tuple, or ``output.sample``."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    sample = getattr(output, "sample", None)
    return sample if isinstance(sample, torch.Tensor) else None


def all_finite(args: tuple, kwargs: dict) -> bool:
    """True when every floating-point tensor among ``args`` / ``kwargs`` (and in tuples / lists of them) is finite."""
    stack = list(args) + list(kwargs.values())
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, torch.Tensor) and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            return False
    return True


def reset_cache_keeping_context(module: nn.Module) -> None:
    """Reset the state of the diffusers cache hooks on ``module`` (``_reset_stateful_cache``), keeping the cache
    context the pipeline set for this forward (``cache_context("cond")``), which the reset clears (diffusers 0.42.1:
    ``StateManager.reset`` sets it to None)."""
    from diffusers.hooks.hooks import StateManager

    contexts = []
    for sub in module.modules():
        registry = getattr(sub, "_diffusers_hook", None)
        for hook in getattr(registry, "hooks", {}).values():
            if getattr(hook, "_is_stateful", False):
                contexts += [(m, m._context) for m in vars(hook).values() if isinstance(m, StateManager)]
    module._reset_stateful_cache()
    for manager, context in contexts:
        manager.set_context(context)


class ForwardGuard:
    """Stands in ``transformer._compiled_call_impl`` (see the module docstring).

    Attributes:
        name: the transformer's pipeline attribute (``transformer`` / ``transformer_2``).
        inner: the ``_compiled_call_impl`` it replaced (``None``: the eager forward).
    """

    def __init__(self, handle, name: str, module: nn.Module):
        self.handle = handle
        self.name = name
        self.module = module
        self.inner = None
        self.had_own = False

    # ---- install ---------------------------------------------------------------------------
    def install(self) -> None:
        """Put the guard in front of whatever forward the module runs now (eager or compiled)."""
        current = self.module.__dict__.get("_compiled_call_impl")
        if current is self:
            return
        self.inner = current
        self.had_own = "_compiled_call_impl" in self.module.__dict__
        self.module._compiled_call_impl = self

    def uninstall(self) -> None:
        """Give the module back the forward the guard wrapped (a later compile by the caller stays)."""
        if self.module.__dict__.get("_compiled_call_impl") is self:
            if self.inner is None and not self.had_own:  # the class's default again: nothing left in the instance
                del self.module.__dict__["_compiled_call_impl"]
            else:
                self.module._compiled_call_impl = self.inner
        self.inner = None

    # ---- per forward ---------------------------------------------------------------------------
    def _forward(self, args, kwargs):
        if self.inner is not None:
            return self.inner(*args, **kwargs)
        return self.module._call_impl(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            # traced: the transformer wrapped by torch.compile(transformer) itself (module docstring)
            return self._forward(args, kwargs)
        handle = self.handle
        handle.before_forward(self.name, self.module, args, kwargs)
        try:
            output = self._forward(args, kwargs)
            groups = context_parallel_groups(getattr(self.module, "_parallel_config", None))
            group = None if groups is None else groups.world
            if not self._not_finite_on_any_rank(output, group):
                return output
            return self._not_finite(output, args, kwargs, group)
        finally:
            handle.after_forward(self.name)

    def _not_finite_on_any_rank(self, output, group) -> bool:
        """Whether the forward's output (its first tensor) is not finite -- on any rank of the context-parallel
        ``group`` (:func:`~rotvid.pipelines.context_parallel.any_rank`; one host read without a group)."""
        sample = first_tensor(output)
        flag = False if sample is None else ~torch.isfinite(sample).all()
        return any_rank(flag, group, self._device() if group is not None and sample is None else None)

    def _device(self) -> torch.device:
        """The device of the module's first parameter (where a collective's flag lives: NCCL needs CUDA)."""
        param = next(self.module.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def _not_finite(self, output, args, kwargs, group=None):
        handle = self.handle
        tracker, report, runtime = handle.tracker, handle._report, handle.runtime
        step, num_steps = (tracker.step, tracker.num_steps) if tracker.in_run() else (None, None)
        where = f"step {step} of {num_steps}" if step is not None else "a forward outside a tracked run"
        if any_rank(not all_finite(args, kwargs), group, self._device()):
            report.record_nonfinite_input(self.name, step)
            logger.warning("rotvid: %s output is not finite at %s, and neither are its inputs (not rotvid's; not "
                           "redone)", self.name, where)
            return output
        if getattr(self.module, "_cache_config", None) is not None:
            reset_cache_keeping_context(self.module)
        runtime.redo = True
        try:
            redone = self._forward(args, kwargs)
        finally:
            runtime.redo = False
        finite = not self._not_finite_on_any_rank(redone, group)
        report.record_redo(self.name, step, num_steps, finite=finite)
        if finite:
            logger.warning("rotvid: %s output was not finite at %s; ran it again with FP16 attention (finite)",
                           self.name, where)
        else:
            logger.warning("rotvid: %s output is not finite at %s even with FP16 attention: the model's own "
                           "(not rotvid's)", self.name, where)
        return redone
