"""The per-call decision and dispatch shared by every rotvid self-attention processor.

For each self-attention call a processor hands over rotated Q, K and V (BHND) and a function
that runs the model's own FP16 attention on them. :meth:`Runtime.attend` then

1. asks the schedule (through the step tracker) whether this (step, block) runs quantized;
2. if so, checks the call can take the quantized recipe — the mask must be a key-padding mask
   (per-batch valid key lengths), the kernel must accept the inputs, the backend must run them —
   and otherwise runs FP16 and records the reason as a *fallback*;
3. calls ``rotvid.kernels.attention(q, k, v, recipe=..., layout="BHND", backend=..., kv_lens=...)``;
4. records the outcome in the :class:`~rotvid.pipelines.report.RunReport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import rotvid.kernels as kernels
from rotvid.kernels.dispatch import validate_attention_inputs
from rotvid.pipelines.config import RotvidConfig, smooth_v_for
from rotvid.pipelines.report import RunReport
from rotvid.pipelines.step_tracker import StepTracker

__all__ = ["AttentionSite", "Runtime", "key_padding_lengths"]


@dataclass(frozen=True)
class AttentionSite:
    """Where a self-attention sits.

    Attributes:
        transformer: pipeline attribute of its transformer (``transformer`` / ``transformer_2``).
        block: global index in execution order over all stacks (0-based).
        num_blocks: number of self-attentions in that transformer.
        stack: index of the block stack; block_in_stack / stack_size: position in it.
    """

    transformer: str
    block: int
    num_blocks: int
    stack: int
    block_in_stack: int
    stack_size: int

    @property
    def key(self) -> str:
        return f"{self.transformer}/{self.block}"


def key_padding_lengths(mask: torch.Tensor | None, batch: int, n_kv: int) -> tuple[torch.Tensor | None, str | None]:
    """Express an attention mask as per-batch valid key lengths, if it is one.

    Accepts boolean masks (True = attend) or additive float masks (0 = attend, -inf = masked)
    of shape [B, N_kv], [B, 1, N_kv] or [B, 1, 1, N_kv] whose valid keys form a prefix
    ``0 .. len-1`` in every batch row (HunyuanVideo's text-padding mask).

    Returns:
        ``(kv_lens int32 [B] or None when nothing is masked, None)`` on success, or
        ``(None, reason)`` when the mask cannot be expressed that way.
    """
    if mask is None:
        return None, None
    shape = tuple(mask.shape)
    if mask.dim() not in (2, 3, 4) or shape[0] != batch or shape[-1] != n_kv or any(s != 1 for s in shape[1:-1]):
        return None, f"attention mask of shape {shape} is not a per-batch key-padding mask [B, 1, 1, N_kv]"
    m = mask.reshape(batch, n_kv)
    if m.dtype == torch.bool:
        valid = m
    elif m.dtype.is_floating_point:
        finite = torch.isfinite(m)
        if bool(((m != 0) & finite).any()):
            return None, "additive attention mask has values other than 0 and -inf (a bias, not a padding mask)"
        valid = m == 0
    else:
        return None, f"attention mask of dtype {m.dtype} (expected bool or float)"
    lens = valid.sum(dim=-1)
    prefix = torch.arange(n_kv, device=m.device).unsqueeze(0) < lens.unsqueeze(1)
    if not bool(torch.equal(prefix, valid)):
        return None, "attention mask's valid keys are not a prefix of the sequence (not expressible as kv_lens)"
    if int(lens.min()) < 1:
        return None, "attention mask leaves a batch row with no valid key"
    if int(lens.min()) == n_kv:
        return None, None
    return lens.to(torch.int32), None


class Runtime:
    """Shared state of one ``apply``: config, step tracker, report, mask cache."""

    def __init__(self, config: RotvidConfig, tracker: StepTracker, report: RunReport):
        self.config = config
        self.tracker = tracker
        self.report = report
        self._mask_key: torch.Tensor | None = None
        self._mask_value: tuple[torch.Tensor | None, str | None] = (None, None)
        # Calibration observers (rotvid.pipelines.capture): called on every self-attention call,
        # before the schedule decides, as observer(site, step, num_steps, q, k, v, kv_lens, fp16_attention).
        self.observers: list[Callable] = []

    def kv_lens_for(self, mask: torch.Tensor | None, batch: int, n_kv: int) -> tuple[torch.Tensor | None, str | None]:
        """:func:`key_padding_lengths`, cached on the mask object (one per transformer forward)."""
        if mask is None:
            return None, None
        if self._mask_key is mask:
            return self._mask_value
        value = key_padding_lengths(mask, batch, n_kv)
        self._mask_key, self._mask_value = mask, value
        return value

    def planned_fp16_reason(self, site: AttentionSite) -> str | None:
        """Why the schedule keeps this call in FP16 (None: run the quantized recipe)."""
        if self.config.recipe == "fp16":
            return "recipe fp16"
        step, num_steps = self.tracker.current()
        return self.config.schedule.fp16_reason(
            step=step,
            num_steps=num_steps,
            block=site.block,
            num_blocks=site.num_blocks,
            block_in_stack=site.block_in_stack,
            stack_size=site.stack_size,
        )

    def attend(
        self,
        site: AttentionSite,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        fp16_attention: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """Run one self-attention.

        Args:
            site: where the call sits.
            q, k, v: [B, H, N, D] (BHND), rotated, in the model's dtype.
            mask: the attention mask the model passed (``None`` for none).
            fp16_attention: runs the model's own attention on (q, k, v, mask), returns BHND.

        Returns:
            [B, H, N_q, D] in q's dtype.
        """
        if self.observers:
            step, num_steps = self.tracker.current()
            obs_kv_lens, _ = self.kv_lens_for(mask, k.shape[0], k.shape[2])
            for observer in self.observers:
                observer(site, step, num_steps, q, k, v, obs_kv_lens, fp16_attention)
        reason = self.planned_fp16_reason(site)
        if reason is not None:
            self.report.record_fp16(site.key, reason)
            return fp16_attention()
        cfg = self.config
        kv_lens, problem = self.kv_lens_for(mask, k.shape[0], k.shape[2])
        if problem is not None:
            self.report.record_fallback(site.key, problem)
            return fp16_attention()
        opts = dict(
            recipe=cfg.recipe,
            layout="BHND",
            kv_lens=kv_lens,
            sm_scale=None,
            smooth_k=cfg.smooth_k,
            smooth_q=cfg.smooth_q,
            smooth_v=smooth_v_for(cfg.recipe, cfg.smooth_v),
            block_m=cfg.block_m,
            block_n=cfg.block_n,
        )
        try:
            validate_attention_inputs(
                q, k, v, recipe=cfg.recipe, layout="BHND", kv_lens=kv_lens, block_m=cfg.block_m, block_n=cfg.block_n
            )
            backend, why = kernels.select_backend(q, k, v, backend=cfg.backend, **opts)
        except ValueError as e:
            self.report.record_fallback(site.key, f"kernel cannot take this call: {e}")
            return fp16_attention()
        out = kernels.attention(q, k, v, backend=backend.name, **opts)
        self.report.record_quantized(site.key, why)
        return out
