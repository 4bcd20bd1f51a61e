"""The shared part of rotvid's self-attention processors (diffusers 0.42.1).

Each family's processor (in its module of :mod:`rotvid.pipelines.families`) mirrors, line for line, the maths of
the diffusers processor it replaces, except for two steps, which it hands to this base class:

* the RoPE step becomes RoPE·R on the video tokens and R alone on the text tokens
  (:class:`~rotvid.pipelines.qk_rotation.QKRotator`); the RoPE·R table goes to the attention call when nothing
  observes the rotated tensors and no context parallelism splits them, and the int8-fp8 CUDA pre-processing
  applies it in its own pass (no separate RoPE·R pass; the FP16 path rotates first);
* the attention call goes through :meth:`~rotvid.pipelines.runtime.Runtime.attend`, which runs
  the quantized recipe or — by the schedule or as a recorded fallback — the model's own
  attention function on the same rotated tensors (diffusers' ``dispatch_attention_fn`` with the
  original processor's backend by default; a processor whose diffusers twin calls
  ``F.scaled_dot_product_attention`` directly passes :meth:`RotvidProcessorBase._sdpa_fp16`).

Under diffusers' context parallelism the attention call is wrapped in rotvid's own exchanges
(:func:`rotvid.pipelines.context_parallel.context_parallel_attend`): each call gets its sequence
shard, rotates it, exchanges it for the full sequence of H/P heads (Ulysses) and/or gathers the
keys of the ring (ring attention: the quantized recipe per key chunk, merged by log-sum-exp),
attends, and exchanges back.

The V/O Hadamard lives in the weights (fused by ``apply``), so nothing here touches V.
Processors are installed with ``attn.set_processor`` on self-attention modules only; their
``__call__`` signatures are the originals' (diffusers' ``Attention.forward`` filters keyword
arguments by that signature).

This module imports neither the runtime nor the kernels (the runtime and the rotator come in as objects), so the
family modules that subclass :class:`RotvidProcessorBase` stay importable from the registry without a circle.
"""

from __future__ import annotations

import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn

from rotvid.pipelines.context_parallel import context_parallel_attend, context_parallel_groups

__all__ = ["RotvidProcessorBase"]


class RotvidProcessorBase:
    """Common state: the runtime, the call site, the rotator and the processor it replaced.

    Args:
        runtime: the :class:`~rotvid.pipelines.runtime.Runtime` of the ``apply``.
        site: the :class:`~rotvid.pipelines.runtime.AttentionSite` of this attention.
        rotator: the :class:`~rotvid.pipelines.qk_rotation.QKRotator` of this attention's rotation.
        original: the processor it replaces.

    Attributes:
        original: the diffusers processor that was installed before (restored by ``remove``);
            its ``_attention_backend`` / ``_parallel_config`` drive the FP16 path.
    """

    def __init__(self, runtime, site, rotator, original):
        self.runtime = runtime
        self.site = site
        self.rotator = rotator
        self.original = original

    @property
    def _parallel_config(self):
        """The diffusers parallel config, kept on the replaced processor.

        ``enable_parallelism`` after ``apply`` sets it through here, so the processor ``remove``
        restores has it too.
        """
        return getattr(self.original, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, value):
        self.original._parallel_config = value

    def _dispatch_fp16(self, q, k, v, mask):
        """diffusers' own attention on BHND q/k/v (it takes BNHD); returns BHND.

        No parallel config is passed: under context parallelism the tensors are already the
        full sequence (rotvid's Ulysses exchange ran before; under ring attention, the keys of the whole ring).
        """
        out = dispatch_attention_fn(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            dropout_p=0.0,
            is_causal=False,
            backend=getattr(self.original, "_attention_backend", None),
            parallel_config=None,
        )
        return out.transpose(1, 2)

    def _sdpa_fp16(self, q, k, v, mask):
        """Plain SDPA on BHND q/k/v (for processors whose diffusers twin calls it directly)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)

    def _rotate_and_attend(self, q, k, v, rope, span, mask, fp16=None):
        """RoPE·R on Q and K (R alone outside ``span``), then the runtime's decision and attention.

        ``fp16`` runs the model's own attention on (q, k, v, mask); default: diffusers' dispatcher.
        Returns BHND.
        """
        fp16 = self._dispatch_fp16 if fp16 is None else fp16
        groups = context_parallel_groups(self._parallel_config)
        table = None
        if groups is None and not self.runtime.observers:
            table = self.rotator.deferred_table(q, rope, span)
        if table is not None:
            # RoPE·R left to the call: the int8-fp8 CUDA pre-processing applies it itself; FP16 rotates here.
            def fp16_rotated():
                return fp16(self.rotator.apply_table(q, table), self.rotator.apply_table(k, table), v, mask)

            return self.runtime.attend(self.site, q, k, v, mask=mask, fp16_attention=fp16_rotated, rope=table)
        q = self.rotator.rotate(q, rope, span)
        k = self.rotator.rotate(k, rope, span)

        def attend(q, k, v, mask, key_chunks=1):
            return self.runtime.attend(self.site, q, k, v, mask=mask, fp16_attention=lambda: fp16(q, k, v, mask),
                                       key_chunks=key_chunks)

        if groups is None:
            return attend(q, k, v, mask)
        if self.runtime.observers:
            raise ValueError(
                f"parallel_config: {self.site.key} runs context-parallel; calibration observers (rotvid calibrate) "
                "would see only this rank's heads — calibrate on one process"
            )
        return context_parallel_attend(groups, q, k, v, mask, attend)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(site={self.site.key}, rotation={self.rotator.kind})"
