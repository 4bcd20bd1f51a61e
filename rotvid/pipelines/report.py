"""The run report: what ran how, per block, and every fallback with its reason.

Three outcomes of a self-attention call:

* ``quantized`` — the configured recipe ran on a rotvid kernel backend (named in ``backends``);
* ``fp16`` — the schedule (or ``recipe="fp16"``) asked for FP16: the model's own attention ran
  on the same rotated tensors;
* ``fallback`` — the schedule asked for the quantized recipe but the call could not take it
  (a mask that is not a key-padding mask, a backend that cannot run the input, ...). It ran in
  FP16 and the reason is counted in ``fallbacks``. Never silent: each distinct reason is also
  logged once at WARNING level.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

__all__ = ["RunReport", "BlockCounts"]

logger = logging.getLogger(__name__)


# the CUDA backend's reasons that mean "no GPU here" (the reference is then the only choice, not a fallback)
_NO_GPU_REASONS = ("cuda: not installed", "cuda: no CUDA GPU", "cuda: inputs are on cpu")


def reference_fallback(backend: str) -> bool:
    """True for a backend record where ``auto`` ran the reference because the CUDA kernel refused a call on a GPU."""
    return backend.startswith("reference (auto;") and not any(r in backend for r in _NO_GPU_REASONS)


@dataclass
class BlockCounts:
    quantized: int = 0
    fp16: int = 0
    fallback: int = 0

    @property
    def total(self) -> int:
        return self.quantized + self.fp16 + self.fallback


@dataclass
class RunReport:
    """Counts of self-attention calls since ``apply`` (or the last :meth:`reset`).

    The calls count on the device (:mod:`rotvid.pipelines.call_counts`, right under
    ``torch.compile``); read the report through ``handle.report``, which brings it up to date.

    Attributes:
        recipe: the quantized recipe that runs (``auto`` resolved).
        recipe_requested: the configured recipe (``auto`` or the recipe itself).
        recipe_reason: why ``recipe`` runs (the auto table's reason, or "as requested").
        backend_requested: the configured backend (``auto`` | ``reference`` | ``cuda``).
        per_block: ``{"<transformer>/<global block>": BlockCounts}``.
        fp16_reasons: ``{reason: count}`` for the planned FP16 calls (schedule rules).
        fallbacks: ``{reason: count}`` for the unplanned FP16 calls.
        backends: ``{backend selection as the dispatcher described it: count}``.
    """

    recipe: str
    backend_requested: str
    recipe_requested: str | None = None
    recipe_reason: str = ""
    per_block: dict[str, BlockCounts] = field(default_factory=dict)
    fp16_reasons: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    backends: dict[str, int] = field(default_factory=dict)

    # ---- recording -----------------------------------------------------------------------
    def _block(self, site: str) -> BlockCounts:
        if site not in self.per_block:
            self.per_block[site] = BlockCounts()
        return self.per_block[site]

    def record_quantized(self, site: str, backend: str, n: int = 1) -> None:
        self._block(site).quantized += n
        if backend not in self.backends and reference_fallback(backend):
            logger.warning("rotvid: self-attention runs on the PyTorch reference (slow) at %s: %s", site, backend)
        self.backends[backend] = self.backends.get(backend, 0) + n

    def record_fp16(self, site: str, reason: str, n: int = 1) -> None:
        self._block(site).fp16 += n
        self.fp16_reasons[reason] = self.fp16_reasons.get(reason, 0) + n

    def record_fallback(self, site: str, reason: str, n: int = 1) -> None:
        self._block(site).fallback += n
        if reason not in self.fallbacks:
            logger.warning("rotvid: self-attention falls back to FP16 at %s: %s", site, reason)
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + n

    def record(self, site: str, outcome: str, detail: str, n: int = 1) -> None:
        """Count ``n`` calls of ``outcome`` (``quantized`` / ``fp16`` / ``fallback``) with its backend or reason."""
        recorders = {"quantized": self.record_quantized, "fp16": self.record_fp16, "fallback": self.record_fallback}
        if outcome not in recorders:
            raise ValueError(f"outcome: expected one of {', '.join(recorders)}, got {outcome!r}")
        recorders[outcome](site, detail, n)

    def reset(self) -> None:
        self.per_block.clear()
        self.fp16_reasons.clear()
        self.fallbacks.clear()
        self.backends.clear()

    # ---- summaries -------------------------------------------------------------------------
    @property
    def total_calls(self) -> int:
        return sum(c.total for c in self.per_block.values())

    @property
    def quantized_calls(self) -> int:
        return sum(c.quantized for c in self.per_block.values())

    @property
    def fp16_calls(self) -> int:
        return sum(c.fp16 for c in self.per_block.values())

    @property
    def fallback_calls(self) -> int:
        return sum(c.fallback for c in self.per_block.values())

    @property
    def quantized_fraction(self) -> float:
        """Fraction of self-attention calls that ran the quantized recipe (0.0 when none ran)."""
        total = self.total_calls
        return self.quantized_calls / total if total else 0.0

    @property
    def int4_fraction(self) -> float:
        """:attr:`quantized_fraction` (the paper's "INT4 fraction" for the int4 recipes)."""
        return self.quantized_fraction

    def to_dict(self) -> dict:
        return {
            "recipe": self.recipe,
            "recipe_requested": self.recipe_requested or self.recipe,
            "recipe_reason": self.recipe_reason,
            "backend_requested": self.backend_requested,
            "total_calls": self.total_calls,
            "quantized_calls": self.quantized_calls,
            "fp16_calls": self.fp16_calls,
            "fallback_calls": self.fallback_calls,
            "quantized_fraction": self.quantized_fraction,
            "backends": dict(self.backends),
            "fp16_reasons": dict(self.fp16_reasons),
            "fallbacks": dict(self.fallbacks),
            "per_block": {k: vars(v).copy() for k, v in self.per_block.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"self-attention calls: {self.total_calls}  quantized ({self.recipe}): {self.quantized_calls} "
            f"({100 * self.quantized_fraction:.1f}%)  fp16 (planned): {self.fp16_calls}  "
            f"fallback: {self.fallback_calls}",
        ]
        if self.recipe_reason:
            lines.append(f"  recipe {self.recipe}: {self.recipe_reason}")
        for name, n in sorted(self.backends.items()):
            flag = "  (FALLBACK from the CUDA kernel: slow)" if reference_fallback(name) else ""
            lines.append(f"  backend {name}: {n} calls{flag}")
        for reason, n in sorted(self.fallbacks.items()):
            lines.append(f"  FALLBACK {n} calls: {reason}")
        return "\n".join(lines)
