"""``RotvidConfig``: everything ``apply`` needs, as a dataclass that round-trips through JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from rotvid.atomic import write_file_atomically
from rotvid.kernels.recipes import AUTO, get_recipe, recipe_names
from rotvid.kernels.sparsity import SparsitySpec, parse_sparsity
from rotvid.pipelines.schedule import Schedule, schedule_preset
from rotvid.rope.hadamard import VO_HADAMARD_MODES

__all__ = [
    "RotvidConfig", "CONFIG_VERSION", "CONFIG_RECIPES", "PIPELINE_RECIPES", "ROTATION_KINDS", "BACKENDS",
    "smooth_v_for", "smooth_q_for", "NeedsPipeline", "check_learned_file", "dense_flags", "check_dense_has_block_map",
]

CONFIG_VERSION = 1
ROTATION_KINDS = ("none", "interleaved", "half", "full")
BACKENDS = ("auto", "reference", "cuda")


def __getattr__(name: str):
    """``PIPELINE_RECIPES`` (the registered recipes) and ``CONFIG_RECIPES`` (``auto`` and those), as of now."""
    if name == "PIPELINE_RECIPES":
        return recipe_names()
    if name == "CONFIG_RECIPES":
        return (AUTO, *recipe_names())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _resolved(recipe: str):
    if recipe == AUTO:
        raise ValueError(f"recipe: expected one of {', '.join(recipe_names())} (resolve 'auto' first), got {recipe!r}")
    return get_recipe(recipe)


def smooth_q_for(recipe: str, smooth_q: bool | None) -> bool:
    """The Q smoothing a call runs: ``smooth_q`` when set, else the recipe's default
    (:attr:`rotvid.kernels.recipes.base.Recipe.smooth_q`; ValueError for a recipe not registered, e.g. unresolved
    ``auto``)."""
    return _resolved(recipe).smoothing(smooth_q, None)[0]


def smooth_v_for(recipe: str, smooth_v: bool | None) -> bool:
    """The V smoothing a call runs: ``smooth_v`` when set, else the recipe's default
    (:attr:`rotvid.kernels.recipes.base.Recipe.smooth_v`)."""
    return _resolved(recipe).smoothing(None, smooth_v)[1]


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")


class NeedsPipeline(ValueError):
    """:meth:`RotvidConfig.from_options` needs the model family's schedule and was not given it: the loaded
    pipeline is needed to tell it."""


def check_learned_file(flag: str, rotation: str) -> None:
    """A ``learned:FILE`` rotation names an existing file (``flag``: the option it came from)."""
    if rotation.startswith("learned:") and not Path(rotation[len("learned:"):]).is_file():
        raise ValueError(f"{flag}{'' if flag.endswith(':') else ' '}{rotation}: the learned-rotation file does not "
                         "exist (rotvid calibrate writes it)")


def dense_flags(dense: dict) -> str:
    """The options that gave the sparsity rules ``dense`` (``{"dense_blocks": ...}``), e.g. ``--dense-blocks``."""
    return ", ".join("--" + k.replace("_", "-") for k in dense)


def check_dense_has_block_map(dense: dict, has_block_map: bool) -> None:
    """The sparsity rules ``dense`` act on a block map: a ValueError when some are given and the run has no map."""
    if dense and not has_block_map:
        raise ValueError(f"{dense_flags(dense)}: sparsity rules without a block map (pass --sparsity radial or "
                         "topp:TAU)")


def _runs_model_attention(recipe: str | None) -> bool:
    """True for a registered recipe that runs the model's own attention (``fp16``: nothing quantized)."""
    from rotvid.kernels.recipes import recipes

    return any(r.name == recipe and not r.quantized for r in recipes())


@dataclass(frozen=True)
class RotvidConfig:
    """How rotvid runs the self-attention of a video pipeline.

    Attributes:
        recipe: quantized recipe of the non-FP16 calls: ``auto`` (default: chosen per GPU when
            the config is applied, see :mod:`rotvid.kernels.recipes.auto` — ``int8-fp8`` on
            Hopper, ``int4`` on Ampere/Ada and the CPU), or a registered recipe
            (:mod:`rotvid.kernels.recipes`): ``int4`` (RotateAttention: INT4 Q/K/V,
            range-optimized P), ``int4-sym-p``, ``int8-fp8``, ``int4-fp8``, ``nvfp4``, or ``fp16``
            (every call FP16 — the fusions alone).
        rotation: Q/K rotation: ``none``, ``interleaved``, ``half``, ``full`` (D×D Hadamard after
            RoPE) or ``learned:<file.safetensors>``.
        vo_hadamard: the per-head V/O Hadamard (RotateAttention's V rotation; exact in full precision): ``off``
            (the default: measured on the bundled proxy's own Q/K/V it moves no recipe's attention error by more
            than 0.01 dB, benchmarks/RESULTS.md), ``online`` -- V·H before each quantized call and its inverse on
            the call's output, no weight touched (1.3-3.3% of an int8-fp8 call on an H200) -- or ``fused`` -- the
            paper's offline fusion into W_v / W_o (zero run-time cost; while applied, every change to those
            weights is refused with one error). With ``off`` and ``online`` LoRAs, ``load_state_dict``,
            offloading, casts and saving compose as without rotvid. ``True`` / ``False`` (older configs) mean
            ``online`` / ``off``.
        smooth_k / smooth_q / smooth_v: smoothing switches passed to the kernel. K is smoothed by
            default; V by the recipe's default when ``smooth_v`` is ``None`` (the default: on for the
            INT4 recipes, off for the FP8-V recipes, :attr:`Recipe.smooth_v
            <rotvid.kernels.recipes.base.Recipe.smooth_v>`; resolved with the recipe when the config is
            applied); Q likewise when ``smooth_q`` is ``None`` (on for the recipes with INT4 Q, off for
            int8-fp8 and the others, :attr:`Recipe.smooth_q <rotvid.kernels.recipes.base.Recipe.smooth_q>`): Q minus
            its per-head mean, the ΔS correction added to the scores by the kernels (the int8-fp8
            kernels do not smooth Q: a call that asks for it there falls back, counted with its reason).
        backend: ``auto`` (the CUDA kernel where it runs the call; a call it refuses runs the model's own
            attention on a GPU — a counted fallback, warned once per run — and the reference on the CPU; the run
            report says which), ``reference`` or ``cuda``.
        schedule: the step x block :class:`Schedule` (FP16 fallback; where block maps apply).
        block_m / block_n: kernel tile sizes (backend default when ``None``).
        sparsity: the block map of the quantized calls (:class:`~rotvid.kernels.sparsity.SparsitySpec` or its text:
            ``none`` -- the default: every key block --, ``radial[:band=INT,window=INT,decay=FLOAT]`` (static, from
            the token grid), ``topp:TAU[,sim=FLOAT]`` and ``pmin:P[,sim=FLOAT]`` (dynamic, per call)). Only calls the
            schedule quantizes get a map, and the schedule's sparsity rules keep some of them dense
            (:mod:`rotvid.pipelines.schedule`).
            ``oracle:DENSITY`` (the exact top blocks per call, :mod:`rotvid.kernels.sparsity.oracle`) is for
            evaluation only: it costs a full-precision attention per call (a warning says so once per ``apply``).
        measure_kept_mass: per call with a map, also compute the exact block attention mass (a full-precision pass
            over the call's Q and K, blockwise) and report the map's **kept mass** (the true mass of the blocks it
            keeps, mean over query rows) next to the oracle's at the same per-row counts (the run report's
            ``sparsity``). Off by default (it costs a dense float attention per call); always on for ``oracle``
            maps, which compute the mass anyway.
        version: config format version (:data:`CONFIG_VERSION`).
    """

    recipe: str = "auto"
    rotation: str = "half"
    vo_hadamard: str = "off"
    smooth_k: bool = True
    smooth_q: bool | None = None
    smooth_v: bool | None = None
    backend: str = "auto"
    schedule: Schedule = field(default_factory=Schedule)
    block_m: int | None = None
    block_n: int | None = None
    sparsity: SparsitySpec = field(default_factory=SparsitySpec)
    measure_kept_mass: bool = False
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        if self.version != CONFIG_VERSION:
            raise ValueError(f"version: expected {CONFIG_VERSION}, got {self.version!r}")
        if self.recipe != AUTO and self.recipe not in recipe_names():
            raise ValueError(f"recipe: expected one of {', '.join((AUTO, *recipe_names()))}, got {self.recipe!r}")
        if not isinstance(self.rotation, str) or not (
            self.rotation in ROTATION_KINDS or (self.rotation.startswith("learned:") and len(self.rotation) > 8)
        ):
            raise ValueError(
                f"rotation: expected one of {', '.join(ROTATION_KINDS)} or 'learned:<file.safetensors>', "
                f"got {self.rotation!r}"
            )
        if isinstance(self.vo_hadamard, bool):  # older configs: True was the (then fused) rotation, now online
            object.__setattr__(self, "vo_hadamard", "online" if self.vo_hadamard else "off")
        if self.vo_hadamard not in VO_HADAMARD_MODES:
            raise ValueError(f"vo_hadamard: expected one of {', '.join(VO_HADAMARD_MODES)} (or true / false), "
                             f"got {self.vo_hadamard!r}")
        _check_bool("smooth_k", self.smooth_k)
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
        sparsity = self.sparsity
        if isinstance(sparsity, dict):  # its JSON form
            sparsity = SparsitySpec.from_dict(sparsity)
        object.__setattr__(self, "sparsity", parse_sparsity(sparsity))  # ValueError naming sparsity (--sparsity)
        _check_bool("measure_kept_mass", self.measure_kept_mass)

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
            "sparsity": self.sparsity.to_dict(),
            "measure_kept_mass": self.measure_kept_mass,
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

    @classmethod
    def from_options(cls, *, base: "RotvidConfig | None" = None, recipe: str | None = None,
                     rotation: str | None = None, schedule: "Schedule | None" = None, backend: str | None = None,
                     smooth_k: bool | None = None, smooth_q: bool | None = None, smooth_v: bool | None = None,
                     sparsity: "str | SparsitySpec | None" = None, dense: dict | None = None,
                     family_schedule: "Schedule | str | Callable[[], str | None] | None" = None,
                     strict_dense: bool = True) -> "RotvidConfig | None":
        """The config of a run from command-line options (``rotvid generate`` / ``eval``; None: not given).

        ``base`` (``--config``) with ``recipe``, ``rotation``, ``backend``, ``smooth_k/q/v`` and ``sparsity``
        changed where given; the schedule is ``schedule`` (``--schedule``), else ``base``'s, else
        ``family_schedule`` (the paper's preset for the model's family, or a function that tells it, called only
        when needed, e.g. one over :func:`rotvid.pipelines.pipeline_config.default_schedule`):
        :class:`NeedsPipeline` (a ValueError) when it is needed and None. ``dense`` (``--dense-first-steps`` /
        ``--dense-blocks``: ``{"dense_first_steps": 2, ...}``, the given ones) go on that schedule when the config has
        a block map; without one a ValueError (``strict_dense``: a single run) or the config as it is (an eval's
        variants, some dense).

        ``recipe`` ``fp16`` (one that runs the model's own attention) without ``rotation`` and without ``base``
        means the untouched pipeline (the FP16 reference): returns None.
        """
        if sparsity is not None and _runs_model_attention(recipe) and parse_sparsity(sparsity).enabled:
            raise ValueError(f"--sparsity {sparsity}: --recipe {recipe} runs the model's own attention, which "
                             "takes no block map (a map applies to quantized calls only)")
        if rotation is not None:
            check_learned_file("--rotation", rotation)
        if base is None and rotation is None and _runs_model_attention(recipe):
            return None
        changes = {k: v for k, v in (("recipe", recipe), ("rotation", rotation), ("backend", backend),
                                     ("sparsity", sparsity), ("smooth_k", smooth_k), ("smooth_q", smooth_q),
                                     ("smooth_v", smooth_v)) if v is not None}
        if schedule is None and base is None:
            if callable(family_schedule):
                family_schedule = family_schedule()
            if family_schedule is None:
                raise NeedsPipeline("--schedule: the model's family is needed to choose the paper schedule")
            schedule = schedule_preset(family_schedule) if isinstance(family_schedule, str) else family_schedule
        if schedule is not None:
            changes["schedule"] = schedule
        cfg = (base or cls()).with_(**changes)
        if not dense:
            return cfg
        has_block_map = cfg.sparsity.enabled or bool(cfg.schedule.block_sparsity)
        if not strict_dense and not has_block_map:
            return cfg
        check_dense_has_block_map(dense, has_block_map)
        return cfg.with_(schedule=replace(cfg.schedule, **dense))

    def resolved(self, recipe: str) -> "RotvidConfig":
        """This config running ``recipe`` (a registered recipe: ``auto`` already resolved) with the smoothing left
        unset (None) set to the recipe's defaults: what ``apply`` runs. ValueError for ``auto`` or an unknown
        recipe."""
        smooth_q, smooth_v = _resolved(recipe).smoothing(self.smooth_q, self.smooth_v)
        return self.with_(recipe=recipe, smooth_q=smooth_q, smooth_v=smooth_v)

    def with_(self, **changes) -> "RotvidConfig":
        """A copy with fields changed (validated again)."""
        return replace(self, **changes)
