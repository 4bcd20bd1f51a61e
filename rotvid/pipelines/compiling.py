"""``torch.compile`` for the transformer(s) of a pipeline rotvid is applied to.

The one documented way is ``apply(pipe, config, compile=True)`` (or ``compile={"mode": ...}``
for options): after attaching rotvid it calls ``transformer.compile(fullgraph=True, ...)`` on
every transformer rotvid is attached to (Wan2.2 A14B: ``transformer`` and ``transformer_2``).
That compiles the modules in place — ``pipe.transformer`` stays the same object, so
``remove(pipe)`` finds it and, for a compile that ``apply`` did, also un-compiles it.

Calling ``pipe.transformer.compile(...)`` yourself *after* ``apply`` works as well; ``remove``
then leaves your compile in place, and the next forward recompiles for the original processors.
Compile *after* ``apply``, not before: the processors are part of what is traced.

``fullgraph=True`` is the default because rotvid's runtime is compile-clean (no graph break) and
a break would hide a regression. Compilation is lazy: the first forward of each distinct plan
(:mod:`rotvid.pipelines.runtime`) pays for it — about two graphs per run with the paper's schedules.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch import nn

__all__ = ["COMPILE_MESSAGE", "compile_options", "compile_transformers", "uncompile_transformers"]

logger = logging.getLogger(__name__)

COMPILE_MESSAGE = "compiling the transformer (first step is slow) ..."
_OPTION_KEYS = ("fullgraph", "dynamic", "backend", "mode", "options")


_PREVIOUS_ATTR = "_rotvid_previous_compiled_call_impl"
_TRACED_ATTR = "_rotvid_traced"  # on the traceable stand-in for diffusers' CP gather (torch < 2.13)


def compile_options(compile) -> dict | None:
    """``apply``'s ``compile`` argument as ``torch.compile`` keyword arguments (None: do not compile).

    Accepts ``False`` / ``True`` or a dict with keys among ``fullgraph``, ``dynamic``, ``backend``,
    ``mode``, ``options`` (``fullgraph`` defaults to True).
    """
    if compile is False or compile is None:
        return None
    if compile is True:
        return {"fullgraph": True}
    if isinstance(compile, dict):
        unknown = sorted(set(compile) - set(_OPTION_KEYS))
        if unknown:
            raise ValueError(
                f"compile: unknown torch.compile options {unknown}; expected a subset of {list(_OPTION_KEYS)}"
            )
        return {"fullgraph": True, **compile}
    raise ValueError(f"compile: expected True, False or a dict of torch.compile options, got {compile!r}")


def _quiet_context_parallel_notice() -> None:
    """Let compiled graphs pass diffusers' context-parallel input notice.

    diffusers' ``_cp_plan`` hook logs "split will not be applied" through ``logger.warning_once`` (a method that
    ``transformers`` adds to ``logging.Logger``) for every input it leaves whole (Wan's 1-D timestep), on every
    forward; torch.compile cannot trace a logger call, so under context parallelism ``fullgraph=True`` broke there,
    before rotvid's code. That one logger's ``warning_once`` becomes a no-op inside compiled graphs
    (``torch._dynamo.config.ignore_logger_methods``, for that logger object only); eager forwards still log it."""
    try:
        from diffusers.hooks import context_parallel as cp_hooks
    except ImportError:  # a diffusers without context parallelism: nothing to quiet
        return
    method = getattr(getattr(cp_hooks, "logger", None), "warning_once", None)
    if method is not None:
        torch._dynamo.config.ignore_logger_methods.add(method)


def _prime_context_parallel_inputs(module: nn.Module) -> None:
    """Let a compiled first forward pass diffusers' context-parallel input hooks.

    diffusers 0.42.1's ``ContextParallelSplitHook`` (the ``_cp_plan``'s input split, e.g. Wan's ``blocks.0``) finds
    each input it splits by the position of its name in the module's ``forward`` signature, read with
    ``inspect.signature`` on the hook's first call and then cached (``ModuleForwardMetadata.
    cached_parameter_indices``). torch.compile cannot trace ``inspect.signature``, so under context parallelism a
    ``fullgraph=True`` compile broke there when the transformer's *first* forward was the compiled one (an eager
    forward before it hid that). The cache is filled here, before compiling, from the same signature."""
    try:
        from diffusers.hooks.context_parallel import ContextParallelSplitHook
    except ImportError:  # a diffusers without context parallelism: nothing to prime
        return
    for sub in module.modules():
        registry = getattr(sub, "_diffusers_hook", None)
        for hook in getattr(registry, "hooks", {}).values():
            meta = getattr(hook, "module_forward_metadata", None)
            if not isinstance(hook, ContextParallelSplitHook) or meta is None or meta._cls is None:
                continue
            if meta.cached_parameter_indices is None:
                names = list(inspect.signature(meta._cls.forward).parameters)[1:]  # without self
                meta.cached_parameter_indices = {name: i for i, name in enumerate(names)}


def _trace_context_parallel_gather() -> None:
    """Let compiled graphs pass diffusers' context-parallel output gather under torch < 2.13.

    diffusers' output hook gathers the sequence with ``torch.distributed._functional_collectives.all_gather_tensor``,
    which calls ``torch._utils._maybe_view_chunk_cat``; torch 2.11's dynamo skips every function of ``torch._utils``,
    so a ``fullgraph=True`` compile of a transformer under context parallelism (rotvid's and diffusers' own alike)
    failed there ("Attempted to call function marked as skipped"); 2.13 traces it. rotvid's floor is 2.13, but torch
    2.11 is what GPU images ship: there the collectives module's reference to the function is replaced by the same
    function under ``torch._dynamo.dont_skip_tracing`` (plain tensor ops: a view or ``torch.cat``), once per
    process. A torch that traces it is left untouched."""
    if _torch_version() >= (2, 13):
        return
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:  # a torch without distributed: no context parallelism to compile
        return
    fn = getattr(funcol, "_maybe_view_chunk_cat", None)
    dont_skip = getattr(torch._dynamo, "dont_skip_tracing", None)
    if fn is None or dont_skip is None or getattr(fn, _TRACED_ATTR, False):
        return
    traced = dont_skip(fn)
    setattr(traced, _TRACED_ATTR, True)
    funcol._maybe_view_chunk_cat = traced


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def compile_transformers(transformers: dict[str, nn.Module], options: dict) -> list[str]:
    """``module.compile(**options)`` on each transformer; returns the names compiled."""
    _quiet_context_parallel_notice()
    _trace_context_parallel_gather()
    for name, module in transformers.items():
        _prime_context_parallel_inputs(module)
        previous = getattr(module, "_compiled_call_impl", None)  # the caller's own compile, given back on undo
        module.compile(**options)
        module.__dict__[_PREVIOUS_ATTR] = previous
        logger.info("rotvid: %s will be compiled on its first forward (%s)", name, options)
    return list(transformers)


def uncompile_transformers(transformers: dict[str, nn.Module], names: list[str]) -> None:
    """Undo :func:`compile_transformers` on the named transformers: eager forwards again, or the compile the
    transformer had before (``module.compile`` by the caller)."""
    for name in names:
        module = transformers[name]
        previous = module.__dict__.pop(_PREVIOUS_ATTR, None)
        if previous is None:  # eager again: the class's default, nothing left in the instance
            module.__dict__.pop("_compiled_call_impl", None)
        else:
            module._compiled_call_impl = previous
