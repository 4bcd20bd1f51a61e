"""``recipe="auto"``: which quantized recipe a GPU runs, and why — one table.

This sits beside the CUDA backend's arch table (:data:`rotvid.kernels.cuda_backend.ARCH_TABLE`,
compute capability -> instruction path): that table says *how* a GPU runs a recipe, this one
says *which* recipe ``auto`` picks on it. :func:`resolve_recipe` is called once when a
:class:`~rotvid.pipelines.config.RotvidConfig` is applied; the recipe and its reason are recorded
in the run report (and the generate sidecar) and printed by ``rotvid backends``.

Why the table looks like this: Hopper (sm90) has no INT4 tensor cores — INT4-valued maths runs
on the INT8/FP8 tensor cores at exactly the 8-bit rate — so on an H100/H200 4-bit buys no speed
over 8-bit, only error (the 8-bit recipe gains 12–16 dB SQNR over INT4 (with its default Q/K/V smoothing) in the accuracy studies).
Ampere and Ada (sm80/86/87/89) have native INT4 ``mma`` at twice the 8-bit rate: the paper's INT4.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AUTO", "RecipeChoice", "RECIPE_TABLE", "FALLBACK_CHOICE", "auto_recipe", "resolve_recipe"]

AUTO = "auto"

# Measured side by side on an H100 (benchmarks/kernel_bench.py, commit 20a09d3, pre-processing included, ratio to
# cuDNN bf16 in the same run, over the five benchmark shapes).
_HOPPER_MEASURED = "H100 kernel_bench at 20a09d3: int8-fp8 1.31-1.50x cuDNN bf16, int4 1.07-1.28x"
_HOPPER_REASON = (
    "no INT4 tensor cores on Hopper: INT4 maths runs at the 8-bit rate, so the 8-bit recipe costs "
    "no speed and gains 12-16 dB SQNR over int4 (accuracy study, benchmarks/RESULTS.md); it is also the faster "
    f"one there ({_HOPPER_MEASURED})"
)
# What a 4-bit recipe asked for by name on Hopper is told (it still runs as asked).
_HOPPER_FOUR_BIT_NOTE = (
    "on sm90 a 4-bit recipe is slower and less accurate than int8-fp8, what recipe='auto' picks there (int4: INT4 "
    f"values on the 8-bit tensor cores, {_HOPPER_MEASURED}; int4-fp8: no CUDA kernel, the reference runs)"
)
_FOUR_BIT = ("int4", "int4-sym-p", "int4-fp8")
_INT4_REASON = "native INT4 tensor cores (mma.m16n8k64.s4, twice the 8-bit rate): the paper's INT4 recipe"


@dataclass(frozen=True)
class RecipeChoice:
    """One row of the auto-recipe table: the recipe ``auto`` picks and why; ``four_bit_note``: what an explicitly
    requested 4-bit recipe's reason adds on that GPU ("" = nothing)."""

    recipe: str
    reason: str
    four_bit_note: str = ""


# compute capability -> the recipe ``auto`` picks there. Keys match ARCH_TABLE's.
RECIPE_TABLE: dict[tuple[int, int], RecipeChoice] = {
    (8, 0): RecipeChoice("int4", _INT4_REASON),
    (8, 6): RecipeChoice("int4", _INT4_REASON),
    (8, 7): RecipeChoice("int4", _INT4_REASON),
    (8, 9): RecipeChoice(
        "int4",
        _INT4_REASON + "; Ada also has FP8 tensor cores and rotvid has an int8-fp8 kernel for them (mma.sync e4m3), "
        "so int8-fp8 could be preferred there for fidelity, but its speed against INT4 was not measured (no Ada GPU "
        "available): int4 until measured",
    ),
    (9, 0): RecipeChoice("int8-fp8", _HOPPER_REASON, four_bit_note=_HOPPER_FOUR_BIT_NOTE),
}

# Everything else: the CPU, and GPUs without a rotvid CUDA kernel. The PyTorch reference runs
# there, equally slow for every recipe, so speed cannot decide; int4 keeps the paper's recipe
# and reproduces bit for bit what the INT4 GPUs (sm80/86/89) run.
FALLBACK_CHOICE = RecipeChoice(
    "int4",
    "the PyTorch reference runs here (no rotvid CUDA kernel); int4 keeps the paper's recipe and reproduces "
    "the numerics of the INT4 GPUs (sm80/86/89)",
)


def _device_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, or None for any other device (or no usable GPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _where(device: torch.device, cap: tuple[int, int] | None) -> str:
    if cap is None:
        return "cpu" if device.type == "cpu" else f"{device.type} (no CUDA GPU)"
    return f"sm{cap[0]}{cap[1]}"


def _default_device(device: torch.device | str | None) -> torch.device:
    """``device``, or when None the current CUDA device (the CPU without a GPU)."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def auto_recipe(device: torch.device | str | None = None) -> tuple[str, str]:
    """The recipe ``auto`` picks on ``device`` (default: the current CUDA device, else the CPU).

    Returns ``(recipe, reason)``; the reason starts with where it was decided (``sm90``, ``cpu``).
    """
    device = _default_device(device)
    cap = _device_capability(device)
    choice = RECIPE_TABLE.get(cap, FALLBACK_CHOICE) if cap is not None else FALLBACK_CHOICE
    where = _where(device, cap)
    if cap is not None and cap not in RECIPE_TABLE:
        known = ", ".join(f"sm{a}{b}" for a, b in RECIPE_TABLE)
        return choice.recipe, f"auto on {where}: not in the table ({known}); {choice.reason}"
    return choice.recipe, f"auto on {where}: {choice.reason}"


def resolve_recipe(config_recipe: str, device: torch.device | str | None = None) -> tuple[str, str]:
    """The recipe a config runs on ``device``, and why.

    ``"auto"`` -> :func:`auto_recipe` (the table); any other recipe is kept as requested (a 4-bit recipe's
    reason adds the table row's ``four_bit_note``: on Hopper, that int8-fp8 is faster and more accurate).
    """
    if config_recipe == AUTO:
        return auto_recipe(device)
    reason = f"{config_recipe} as requested"
    row = RECIPE_TABLE.get(_device_capability(_default_device(device)))
    if config_recipe in _FOUR_BIT and row is not None and row.four_bit_note:
        reason += f"; {row.four_bit_note}"
    return config_recipe, reason
