"""``rotvid eval`` on existing videos: match, measure, optionally score with VBench, write the report.

The Table-1 columns of a candidate come from the sidecars written by ``rotvid generate`` (recipe,
rotation, generation time, quantized fraction, block-map density, device, dtype, steps, backend) when they are
present, else show "–".
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rotvid.eval.matching import CandidateSet, match_videos
from rotvid.eval.pixel_metrics import compare_files
from rotvid.eval.report import REPORT_FILES, RUN_FACTS, EvalReport, VariantResult, write_report
from rotvid.eval.sidecar import read_sidecar
from rotvid.eval.variants import VariantSpec
from rotvid.kernels.recipes import recipe_names

logger = logging.getLogger(__name__)

VideoCallback = Callable[[str, str], None]  # (variant label, video name) before each comparison


@dataclass
class VBenchRequest:
    """Which VBench dimensions to score, with which interpreter (see :mod:`rotvid.eval.vbench_runner`)."""

    dimensions: list[str]
    python: Path
    device: str = "auto"
    cache_dir: Path | None = None


def check_report_folder(out: Path, *, overwrite: bool) -> None:
    """``FileExistsError`` when ``out`` already holds a report and ``overwrite`` is false."""
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out}: expected a folder for the report, got a file")
    existing = [f for f in REPORT_FILES if (Path(out) / f).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"report folder {out} already holds {', '.join(existing)} (pass --overwrite to replace)")


def _columns_from_sidecars(sidecars: list[dict | None]) -> tuple[str, str, str]:
    specs = {(s.get("recipe"), s.get("rotation")) for s in sidecars if s is not None}
    if len(specs) != 1 or None in sidecars:
        return ("–", "–", "–")
    recipe, rotation = specs.pop()
    if recipe not in recipe_names() or not isinstance(rotation, str):
        return ("–", "–", "–")
    return VariantSpec(recipe, rotation).table_columns()


def _step_seconds(sidecars: list[dict | None]) -> float | None:
    """Median denoising-step time over the videos (step 0 of each left out when it has more)."""
    if not sidecars or any(s is None or "timing" not in s for s in sidecars):
        return None
    steps = []
    for s in sidecars:
        per = list(s["timing"].get("per_step_seconds") or [])
        steps += per[1:] if len(per) > 1 else per
    return float(statistics.median(steps)) if steps else None


def _quantized_fraction(sidecars: list[dict | None]) -> float | None:
    """Mean quantized fraction of the sidecars (``int4_fraction`` in sidecars written before the rename)."""
    from rotvid.eval.generation import quantized_fraction

    fractions = [quantized_fraction(s) if s is not None else None for s in sidecars]
    if not fractions or any(f is None for f in fractions):
        return None
    return float(sum(fractions) / len(fractions))


def _mean_of(sidecars: list[dict | None], key: str) -> float | None:
    """Mean of a sidecar number over the videos that have it (``mean_density``, ``mean_dropped_mass``); None when
    none has."""
    values = [float(s[key]) for s in sidecars if s is not None and s.get(key) is not None]
    return sum(values) / len(values) if values else None


_DTYPE_LABELS = {"bfloat16": "BF16", "float16": "FP16", "float32": "FP32"}


def _backend(side: dict) -> str | None:
    """The attention backend(s) of one sidecar's run ("the model's own attention" for the untouched pipeline)."""
    report = side.get("run_report")
    if report is None:
        return "the model's own attention" if side.get("recipe") == "fp16" else None
    used = sorted((report.get("backends") or {}).keys())
    return ", ".join(used) if used else f"{report.get('backend_requested', '?')} (no quantized call)"


def run_facts(sidecars: list[dict | None]) -> dict:
    """What ran (:data:`rotvid.eval.report.RUN_FACTS`) according to the sidecars: each fact the sidecars
    agree on, ``"mixed"`` where they differ; ``{}`` when a video has no sidecar."""
    if not sidecars or any(s is None for s in sidecars):
        return {}
    facts: dict = {}
    for key in RUN_FACTS:
        values = {(_backend(s) if key == "backend" else s.get(key)) for s in sidecars}
        values.discard(None)
        if values:
            facts[key] = values.pop() if len(values) == 1 else "mixed"
    return facts


def _with_dtype(columns: tuple[str, str, str], facts: dict) -> tuple[str, str, str]:
    """The untouched attention's datatype is the model's dtype that ran (BF16 when bf16 ran), not "FP16"."""
    if facts.get("recipe") == "fp16" and facts.get("dtype") in _DTYPE_LABELS:
        return (_DTYPE_LABELS[facts["dtype"]], *columns[1:])
    return columns


def measure(
    reference_label: str,
    reference_source: str,
    sets: Sequence[CandidateSet],
    *,
    columns: dict[str, tuple[str, str, str]] | None = None,
    on_video: VideoCallback | None = None,
) -> EvalReport:
    """Pixel metrics of every pair, with sidecar facts; VBench is added by :func:`add_vbench`."""
    variants = []
    ref_sidecars: dict[Path, dict | None] = {}
    for cs in sets:
        videos, sides = [], []
        for pair in cs.pairs:
            if on_video is not None:
                on_video(cs.variant, pair.name)
            videos.append(compare_files(pair.reference, pair.candidate, name=pair.name))
            sides.append(read_sidecar(pair.candidate))
            ref_sidecars.setdefault(pair.reference, read_sidecar(pair.reference))
        facts = run_facts(sides)
        cols = _with_dtype((columns or {}).get(cs.variant) or _columns_from_sidecars(sides), facts)
        variants.append(
            VariantResult(label=cs.variant, source=str(cs.source), videos=videos, columns=cols,
                          step_seconds=_step_seconds(sides), quantized_fraction=_quantized_fraction(sides),
                          run=facts, density=_mean_of(sides, "mean_density"),
                          dropped_mass=_mean_of(sides, "mean_dropped_mass"))
        )
    ref_sides = list(ref_sidecars.values())
    ref_facts = run_facts(ref_sides)
    return EvalReport(
        reference_label=reference_label,
        reference_source=reference_source,
        variants=variants,
        reference_step_seconds=_step_seconds(ref_sides),
        reference_columns=_with_dtype(_columns_from_sidecars(ref_sides), ref_facts),
        reference_run=ref_facts,
    )


def _prompt_of(video: Path) -> str:
    side = read_sidecar(video)
    if side and isinstance(side.get("request"), dict) and side["request"].get("prompt"):
        return str(side["request"]["prompt"])
    return video.stem  # VBench's own rule for custom videos: the prompt is the file name


def _vbench_folder(videos: list[Path], tmp: Path) -> tuple[Path, dict[str, str]]:
    """A folder of links named as the videos (VBench reads a whole folder), and their prompts."""
    tmp.mkdir(parents=True, exist_ok=True)
    prompts = {}
    for v in videos:
        link = tmp / v.name
        os.symlink(v.resolve(), link)
        prompts[v.name] = _prompt_of(v)
    return tmp, prompts


def add_vbench(report: EvalReport, sets: Sequence[CandidateSet], request: VBenchRequest,
               progress: Callable[[str], None] | None = None) -> None:
    """Score the reference videos and each variant's videos on the requested VBench dimensions; ``progress``
    gets one line per group of videos before VBench runs on it (a group can take minutes)."""
    from rotvid.eval.vbench_runner import run_vbench

    report.vbench_dimensions = list(request.dimensions)
    groups: list[tuple[str | None, list[Path]]] = [(None, [p.reference for p in sets[0].pairs])]
    groups += [(cs.variant, [p.candidate for p in cs.pairs]) for cs in sets]
    by_label = {v.label: v for v in report.variants}
    with tempfile.TemporaryDirectory(prefix="rotvid-vbench-videos-") as tmp:
        for i, (label, videos) in enumerate(groups):
            if progress is not None:
                progress(f"VBench [{i + 1}/{len(groups)}] {label or 'reference'}: {len(videos)} video(s), "
                         f"{', '.join(request.dimensions)}")
            folder, prompts = _vbench_folder(videos, Path(tmp) / str(i))
            scores = run_vbench(request.python, folder, prompts, request.dimensions, device=request.device,
                                cache_dir=request.cache_dir)
            if label is None:
                report.reference_vbench = scores.means()
            else:
                by_label[label].vbench = scores.means()
            report.meta.setdefault("VBench", f"{scores.vbench_version} on {scores.device}, custom_input mode")


def evaluate_paths(
    reference: str | os.PathLike,
    candidates: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    vbench: VBenchRequest | None = None,
    samples: int = 4,
    on_video: VideoCallback | None = None,
    on_vbench: Callable[[str], None] | None = None,
) -> tuple[EvalReport, dict[str, Path]]:
    """The whole path form of ``rotvid eval``; returns the report and the files written (``on_video`` /
    ``on_vbench``: progress per measured pair / per VBench group)."""
    from rotvid.eval.vbench_runner import check_weights

    out = Path(out)
    sets = match_videos(reference, candidates)
    check_report_folder(out, overwrite=overwrite)
    if vbench is not None:
        check_weights(vbench.dimensions, vbench.cache_dir)
    ref = Path(reference)
    report = measure(ref.resolve().name if ref.is_dir() else ref.stem, str(ref), sets, on_video=on_video)
    if vbench is not None:
        add_vbench(report, sets, vbench, progress=on_vbench)
    first = sets[0].pairs[0]
    rows = [(report.reference_label, first.reference)]
    rows += [(cs.variant, next(p.candidate for p in cs.pairs if p.name == first.name)) for cs in sets]
    written = write_report(out, report, comparison_rows=rows, comparison_video=first.name, samples=samples)
    return report, written
