"""``RotvidConfig``: everything ``apply`` needs, as a dataclass that round-trips through JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from rotvid.pipelines.schedule import Schedule, schedule_preset

__all__ = [
    "RotvidConfig", "CONFIG_VERSION", "CONFIG_RECIPES", "PIPELINE_RECIPES", "ROTATION_KINDS", "BACKENDS",
    "SMOOTH_V_BY_RECIPE", "smooth_v_for", "SMOOTH_Q_BY_RECIPE", "smooth_q_for",
]

CONFIG_VERSION = 1
# "fp16" runs every self-attention through the model's own attention function (diffusers'
# dispatcher / SDPA), on the rotated tensors: the exactness check of every fusion.
PIPELINE_RECIPES = ("fp16", "int4", "int4-sym-p", "int8-fp8", "int4-fp8", "nvfp4")
# "auto" is resolved once per apply from the GPU (rotvid.kernels.recipe_table.resolve_recipe).
CONFIG_RECIPES = ("auto", *PIPELINE_RECIPES)
ROTATION_KINDS = ("none", "interleaved", "half", "full")
BACKENDS = ("auto", "reference", "cuda")

# V smoothing when a config leaves it unset (smooth_v=None), per recipe. The INT4 recipes smooth V (the paper;
# their V scales are per key block, and the kernels add the mean back in the epilogue). The FP8-V recipes do not:
# with one FP8 scale per channel over the whole sequence, subtracting the mean first cost cosine vs float64 at
# video lengths on zero-mean V (int8-fp8: 0.99937 -> 0.99664 at 119K tokens, 0.99934 -> 0.99902 at 33K; CPU
# reference, benchmarks/accuracy_vs_length.py, RESULTS.md 2026-11-23).
SMOOTH_V_BY_RECIPE = {
    "fp16": False, "int4": True, "int4-sym-p": True, "int8-fp8": False, "int4-fp8": False, "nvfp4": False,
}
# Q smoothing (one mean per head, its ΔS added to the scores as a bias per key) when a config leaves it unset
# (smooth_q=None). On for the recipes with INT4 Q: +3.6 to +5.1 dB mean SQNR for int4 with per-block means,
# +3.1 to +4.6 dB with the per-head mean the kernels use (CPU reference, 27 synthetic RoPE-structured sets,
# RESULTS.md session 7). Off for int8-fp8 (+0.5 to +0.9 dB, and its kernels do not smooth Q) and the others.
SMOOTH_Q_BY_RECIPE = {
    "fp16": False, "int4": True, "int4-sym-p": True, "int8-fp8": False, "int4-fp8": True, "nvfp4": False,
}


def _switch_for(table: dict[str, bool], recipe: str, value: bool | None) -> bool:
    """``value`` when set, else ``table[recipe]`` (ValueError for a recipe not in the table, e.g. unresolved 'auto')."""
    if value is not None:
        return value
    if recipe not in table:
        raise ValueError(f"recipe: expected one of {', '.join(table)} (resolve 'auto' first), got {recipe!r}")
    return table[recipe]


def smooth_q_for(recipe: str, smooth_q: bool | None) -> bool:
    """The Q smoothing a call runs: ``smooth_q`` when set, else the recipe's default (:data:`SMOOTH_Q_BY_RECIPE`)."""
    return _switch_for(SMOOTH_Q_BY_RECIPE, recipe, smooth_q)


def smooth_v_for(recipe: str, smooth_v: bool | None) -> bool:
    """The V smoothing a call runs: ``smooth_v`` when set, else the recipe's default (:data:`SMOOTH_V_BY_RECIPE`)."""
    return _switch_for(SMOOTH_V_BY_RECIPE, recipe, smooth_v)


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")


@dataclass(frozen=True)
class RotvidConfig:
    """How rotvid runs the self-attention of a video pipeline.

    Attributes:
        recipe: quantized recipe of the non-FP16 calls: ``auto`` (default: chosen per GPU when
            the config is applied, see :mod:`rotvid.kernels.recipe_table` — ``int8-fp8`` on
            Hopper, ``int4`` on Ampere/Ada and the CPU), ``int4`` (RotateAttention: INT4 Q/K/V,
            range-optimized P), ``int4-sym-p``, ``int8-fp8``, ``int4-fp8``, ``nvfp4``, or ``fp16``
            (every call FP16 — the fusions alone).
        rotation: Q/K rotation: ``none``, ``interleaved``, ``half``, ``full`` (D×D Hadamard after
            RoPE) or ``learned:<file.safetensors>``.
        vo_hadamard: fuse a per-head Hadamard into W_v / W_o (exact; zero run-time cost).
        smooth_k / smooth_q / smooth_v: smoothing switches passed to the kernel. K is smoothed by
            default; V by the recipe's default when ``smooth_v`` is ``None`` (the default: on for the
            INT4 recipes, off for the FP8-V recipes, :data:`SMOOTH_V_BY_RECIPE`; resolved with the
            recipe when the config is applied); Q likewise when ``smooth_q`` is ``None`` (on for the
            recipes with INT4 Q, off for int8-fp8 and the others, :data:`SMOOTH_Q_BY_RECIPE`): Q minus
            its per-head mean, the ΔS correction added to the scores by the kernels (the int8-fp8
            kernels do not smooth Q: a call that asks for it there falls back, counted with its reason).
        backend: ``auto`` (the CUDA kernel where it runs the call; a call it refuses runs the model's own
            attention on a GPU — a counted fallback, warned once per run — and the reference on the CPU; the run
            report says which), ``reference`` or ``cuda``.
        schedule: the FP16-fallback :class:`Schedule`.
        block_m / block_n: kernel tile sizes (backend default when ``None``).
        version: config format version (:data:`CONFIG_VERSION`).
    """

    recipe: str = "auto"
    rotation: str = "half"
    vo_hadamard: bool = True
    smooth_k: bool = True
    smooth_q: bool | None = None
    smooth_v: bool | None = None
    backend: str = "auto"
    schedule: Schedule = field(default_factory=Schedule)
    block_m: int | None = None
    block_n: int | None = None
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.version != CONFIG_VERSION:
            raise ValueError(f"version: expected {CONFIG_VERSION}, got {self.version!r}")
        if self.recipe not in CONFIG_RECIPES:
            raise ValueError(f"recipe: expected one of {', '.join(CONFIG_RECIPES)}, got {self.recipe!r}")
        if not isinstance(self.rotation, str) or not (
            self.rotation in ROTATION_KINDS or (self.rotation.startswith("learned:") and len(self.rotation) > 8)
        ):
            raise ValueError(
                f"rotation: expected one of {', '.join(ROTATION_KINDS)} or 'learned:<file.safetensors>', "
                f"got {self.rotation!r}"
            )
        for name in ("vo_hadamard", "smooth_k"):
            _check_bool(name, getattr(self, name))
        for name in ("smooth_q", "smooth_v"):
            if getattr(self, name) is not None:
                _check_bool(name, getattr(self, name))
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if isinstance(self.schedule, str):
            object.__setattr__(self, "schedule", schedule_preset(self.schedule))
        if not isinstance(self.schedule, Schedule):
            raise ValueError(f"schedule: expected a Schedule or a preset name, got {self.schedule!r}")
        for name in ("block_m", "block_n"):
            val = getattr(self, name)
            if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {val!r}")

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "recipe": self.recipe,
            "rotation": self.rotation,
            "vo_hadamard": self.vo_hadamard,
            "smooth_k": self.smooth_k,
            "smooth_q": self.smooth_q,
            "smooth_v": self.smooth_v,
            "backend": self.backend,
            "schedule": self.schedule.to_dict(),
            "block_m": self.block_m,
            "block_n": self.block_n,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "RotvidConfig":
        if not isinstance(d, dict):
            raise ValueError(f"config: expected a JSON object, got {type(d).__name__}")
        if "version" not in d:
            raise ValueError("config: expected a 'version' field")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown keys {sorted(unknown)}; expected a subset of {sorted(known)}")
        d = dict(d)
        if "schedule" in d and isinstance(d["schedule"], dict):
            d["schedule"] = Schedule.from_dict(d["schedule"])
        return cls(**d)

    def to_json(self, path: str | Path | None = None) -> str:
        """The config as JSON text; also written to ``path`` when given (atomically: a temporary name, then a
        rename, so an existing file is replaced whole or not at all)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            from rotvid.eval.video_io import write_file_atomically

            write_file_atomically(Path(path), text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "RotvidConfig":
        """Parse JSON text, or read it from a file path."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            path = Path(text)
            if not path.is_file():
                raise ValueError(f"text_or_path: expected JSON text or an existing file, got {text!r}")
            text = path.read_text()
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"text_or_path: not valid JSON ({e})") from None
        return cls.from_dict(d)

    def with_(self, **changes) -> "RotvidConfig":
        """A copy with fields changed (validated again)."""
        return replace(self, **changes)
