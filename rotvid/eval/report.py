"""The report folder of ``rotvid eval``.

``report.md``        one table like the paper's Table 1 (variant, datatype, optimized P, rotation,
                     Cosine ↑, MSE ↓, SSIM ↑, PSNR ↑, VBench dimensions, block-map density, time), the sparse
                     variants against their dense twins, then per video
``metrics.csv``      one row per (variant, video) plus a ``mean`` row per variant
``metrics.json``     everything, per-frame PSNR included (``inf`` written as the string "inf")
``psnr_per_frame.png`` per-frame PSNR of each variant, averaged over videos (needs matplotlib)
``comparison.png``   sampled frames of one video: reference on top, one row per variant

Every file is written through a temporary name and renamed (see :mod:`rotvid.eval.video_io`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rotvid.atomic import write_file_atomically
from rotvid.eval.pixel_metrics import VideoMetrics, float_to_json, mean_metrics
from rotvid.eval.video_io import iter_frames

logger = logging.getLogger(__name__)

REPORT_FILES = ("report.md", "metrics.csv", "metrics.json", "psnr_per_frame.png", "comparison.png")

# the facts of a run recorded per variant (from the sidecars): where, in which dtype, how many steps, what ran
RUN_FACTS = ("device", "device_name", "dtype", "steps", "recipe", "backend")

CPU_TIMING_NOTE = ("timings ran on a CPU, where quantized attention runs the PyTorch reference (exact, slow): "
                   "they are not speed measurements, so no speedup is shown")


@dataclass
class VariantResult:
    """The metrics of one variant (a candidate folder/file or a generated variant).

    ``columns`` are the Table-1 (datatype, optimized P, rotation) marks, ``("–", "–", "–")`` when
    unknown. ``step_seconds`` is the median time of one denoising step over its videos (from the
    sidecars; the first step of each video, which also encodes the prompt, is left out) or None.
    ``quantized_fraction``: the fraction of self-attention calls that ran the quantized recipe
    (any recipe: INT4, INT8/FP8, ...). ``run``: what ran, from the sidecars (:data:`RUN_FACTS`:
    device, dtype, steps, recipe, backend; a fact the videos disagree on is ``"mixed"``). ``density``: the mean
    density of the block maps its calls ran with (kept key blocks / all; None without a map), ``dropped_mass``: top-p's
    mean estimated dropped mass (None for static maps and without a map).
    """

    label: str
    source: str
    videos: list[VideoMetrics]
    columns: tuple[str, str, str] = ("–", "–", "–")
    step_seconds: float | None = None
    quantized_fraction: float | None = None
    vbench: dict[str, float] = field(default_factory=dict)
    run: dict = field(default_factory=dict)
    density: float | None = None
    dropped_mass: float | None = None

    @property
    def mean(self) -> dict[str, float]:
        return mean_metrics(self.videos)


@dataclass
class EvalReport:
    """A whole comparison: the reference, its variants, VBench scores and run facts."""

    reference_label: str
    reference_source: str
    variants: list[VariantResult]
    reference_step_seconds: float | None = None
    reference_columns: tuple[str, str, str] = ("FP16", "–", "–")
    reference_vbench: dict[str, float] = field(default_factory=dict)
    vbench_dimensions: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reference_run: dict = field(default_factory=dict)
    # sparse variants measured against their dense twin (same recipe and rotation, no block map): label "A vs B"
    versus_dense: list[VariantResult] = field(default_factory=list)

    @property
    def timed_on_cpu(self) -> bool:
        """Whether any timed video ran on a CPU (its times then measure the PyTorch reference, not speed)."""
        runs = [self.reference_run, *(v.run for v in self.variants)]
        return any(str(r.get("device", "")).startswith(("cpu", "mixed")) for r in runs)


def format_psnr(x: float) -> str:
    return "∞" if math.isinf(x) and x > 0 else f"{x:.3f}"


def psnr_cell(videos: list[VideoMetrics]) -> str:
    """Mean PSNR over videos; when only some are identical (∞), the finite mean is shown too."""
    vals = [v.psnr for v in videos]
    finite = [x for x in vals if not math.isinf(x)]
    if len(finite) == len(vals):
        return f"{float(np.mean(finite)):.3f}"
    if not finite:
        return "∞"
    return f"∞ ({len(vals) - len(finite)}/{len(vals)} identical; others {float(np.mean(finite)):.3f})"


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def _time_columns(report: EvalReport) -> bool:
    return report.reference_step_seconds is not None and all(v.step_seconds is not None for v in report.variants)


def summary_table(report: EvalReport) -> str:
    """The Table-1-like markdown table (means over videos)."""
    dims = report.vbench_dimensions
    timed = _time_columns(report)
    head = ["Variant", "Datatype", "Optim-P", "Rotation", "Cosine ↑", "MSE ↓", "SSIM ↑", "PSNR ↑"]
    head += [f"{d} ↑" for d in dims]
    head += ["Quantized calls"]
    sparse = _sparse_columns(report)
    if sparse:
        head += ["Density"]
    speed_measured = timed and not report.timed_on_cpu
    if speed_measured:
        head += ["s/step", "Speedup"]
    elif timed:
        head += ["s/step (CPU, not a speed measurement)"]
    rows = []
    # the reference against itself: the identity values, by definition
    ref = [report.reference_label, *report.reference_columns, "1.0000", "0.00", "1.0000", "∞"]
    ref += [_fmt(report.reference_vbench.get(d), ".4f") for d in dims]
    untouched = report.reference_run.get("recipe") == "fp16" or (
        not report.reference_run and report.reference_columns[0] == "FP16")
    ref += ["0%" if untouched else "–"]
    if sparse:
        ref += ["–"]
    if timed:
        ref += [f"{report.reference_step_seconds:.3g}"] + (["1.00×"] if speed_measured else [])
    rows.append(ref)
    for v in report.variants:
        m = v.mean
        row = [v.label, *v.columns, f"{m['cosine']:.4f}", f"{m['mse']:.2f}", f"{m['ssim']:.4f}", psnr_cell(v.videos)]
        row += [_fmt(v.vbench.get(d), ".4f") for d in dims]
        row += ["–" if v.quantized_fraction is None else f"{100 * v.quantized_fraction:.0f}%"]
        if sparse:
            row += [_fmt(v.density, ".3f")]
        if timed:
            row += [f"{v.step_seconds:.3g}"]
            if speed_measured:
                speed = report.reference_step_seconds / v.step_seconds if v.step_seconds > 0 else math.nan
                row += [f"{speed:.2f}×"]
        rows.append(row)
    return _markdown_table(head, rows)


def _sparse_columns(report: EvalReport) -> bool:
    """Whether any variant ran with block maps (the summary then has a Density column)."""
    return any(v.density is not None for v in report.variants)


def versus_dense_table(report: EvalReport) -> str | None:
    """Each sparse variant against its dense twin (the same recipe and rotation without a map), or None."""
    if not report.versus_dense:
        return None
    head = ["Sparse vs dense", "Density", "Dropped mass (est.)", "Cosine ↑", "MSE ↓", "SSIM ↑", "PSNR ↑"]
    rows = []
    for v in report.versus_dense:
        m = v.mean
        dropped = _fmt(v.dropped_mass, ".4f") if v.dropped_mass is not None else "not estimated"
        rows.append([v.label, _fmt(v.density, ".3f"), dropped, f"{m['cosine']:.4f}", f"{m['mse']:.2f}",
                     f"{m['ssim']:.4f}", psnr_cell(v.videos)])
    return _markdown_table(head, rows)


def runs_table(report: EvalReport) -> str | None:
    """What ran for the reference and each variant (recipe, backend, device, dtype, steps), or None when no
    sidecar told."""
    runs = [(report.reference_label, report.reference_run)] + [(v.label, v.run) for v in report.variants]
    if not any(r for _, r in runs):
        return None
    head = ["Variant", "Recipe", "Backend", "Device", "Dtype", "Steps"]
    rows = []
    for label, r in runs:
        device, name = str(r.get("device", "–")), r.get("device_name")
        if name and name != "mixed":
            device = str(name) if f"({device})" in str(name) else f"{device} ({name})"
        recipe = r.get("recipe", "–")
        if recipe == "fp16":  # rotvid's name for "nothing quantized": the attention ran in the model's dtype
            recipe = f"none ({r.get('dtype', 'model dtype')} attention)"
        rows.append([label, str(recipe), str(r.get("backend", "–")), device,
                     *(str(r.get(k, "–")) for k in ("dtype", "steps"))])
    return _markdown_table(head, rows)


def per_video_table(report: EvalReport) -> str:
    head = ["Variant", "Video", "Frames", "Size", "Cosine ↑", "MSE ↓", "SSIM ↑", "PSNR ↑"]
    rows = []
    for v in report.variants:
        for m in v.videos:
            rows.append(
                [v.label, m.name, str(m.frames), f"{m.width}×{m.height}", f"{m.cosine:.4f}", f"{m.mse:.2f}",
                 f"{m.ssim:.4f}", format_psnr(m.psnr)]
            )
    return _markdown_table(head, rows)


def _markdown_table(head: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def report_markdown(report: EvalReport, *, images: dict[str, str]) -> str:
    """The text of ``report.md``; ``images`` maps a caption to a file name in the folder."""
    parts = ["# rotvid eval", ""]
    parts.append(f"Reference: `{report.reference_source}` (label {report.reference_label}).")
    for key, val in report.meta.items():
        parts.append(f"- {key}: {val}")
    if report.timed_on_cpu and _time_columns(report):
        timing = f"s/step: median time of one denoising step (from the sidecars); {CPU_TIMING_NOTE}."
    else:
        timing = ("s/step: median time of one denoising step (from the sidecars); Speedup: the reference's s/step "
                  "over the variant's.")
    parts += [
        "",
        "Metrics on 8-bit pixels (0..255), averaged over videos: cosine similarity, MSE, SSIM "
        "(scikit-image, per frame, averaged), PSNR in dB (10·log10(255²/MSE) per video, then averaged; ∞ when "
        "identical). Quantized calls: the fraction of self-attention calls that ran the variant's quantized "
        f"recipe. {timing}",
        "",
        summary_table(report),
        "",
    ]
    if _sparse_columns(report):
        parts += ["Density: kept key blocks / all key blocks of the block maps the variant's quantized calls ran "
                  "with (mean over those calls; – without a map).", ""]
    versus = versus_dense_table(report)
    if versus is not None:
        parts += ["## Sparse variants against their dense twin", "",
                  "The same metrics with the dense variant (same recipe and rotation, no block map) as the "
                  "reference: what the map alone changes. Dropped mass: top-p's estimate of the skipped attention "
                  "mass; static maps (radial) have none.", "", versus, ""]
    runs = runs_table(report)
    if runs is not None:
        parts += ["## What ran", "", runs, ""]
    parts += [
        "## Per video",
        "",
        per_video_table(report),
        "",
    ]
    for caption, fname in images.items():
        parts += [f"## {caption}", "", f"![{caption}]({fname})", ""]
    if report.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    return "\n".join(parts)


def metrics_csv(report: EvalReport) -> str:
    dims = report.vbench_dimensions
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "video", "frames", "height", "width", "psnr", "ssim", "cosine", "mse", *dims])
    for v in report.variants:
        for m in v.videos:
            w.writerow([v.label, m.name, m.frames, m.height, m.width, _csv_float(m.psnr), repr(m.ssim),
                        repr(m.cosine), repr(m.mse)] + [""] * len(dims))
        mean = v.mean
        w.writerow([v.label, "mean", "", "", "", _csv_float(mean["psnr"]), repr(mean["ssim"]), repr(mean["cosine"]),
                    repr(mean["mse"])] + [_csv_opt(v.vbench.get(d)) for d in dims])
    if dims:
        w.writerow([report.reference_label, "mean", "", "", "", "", "", "", ""]
                   + [_csv_opt(report.reference_vbench.get(d)) for d in dims])
    return buf.getvalue()


def _csv_float(x: float) -> str:
    return "inf" if math.isinf(x) and x > 0 else repr(x)


def _csv_opt(x: float | None) -> str:
    return "" if x is None else repr(x)


def metrics_json(report: EvalReport) -> str:
    data = {
        "reference": {
            "label": report.reference_label,
            "source": report.reference_source,
            "step_seconds": report.reference_step_seconds,
            "vbench": report.reference_vbench,
            "run": report.reference_run,
        },
        "timings_are_speed_measurements": not report.timed_on_cpu,
        "vbench_dimensions": report.vbench_dimensions,
        "meta": report.meta,
        "notes": report.notes,
        "variants": [
            {
                "label": v.label,
                "source": v.source,
                "datatype": v.columns[0],
                "optimized_p": v.columns[1],
                "rotation": v.columns[2],
                "step_seconds": v.step_seconds,
                "quantized_fraction": v.quantized_fraction,
                "int4_fraction": v.quantized_fraction,  # the old name, kept for one version
                "density": v.density,
                "dropped_mass": v.dropped_mass,
                "run": v.run,
                "mean": {k: float_to_json(x) for k, x in v.mean.items()},
                "identical_videos": sum(math.isinf(m.psnr) for m in v.videos),
                "psnr_mean_of_finite": _finite_mean([m.psnr for m in v.videos]),
                "vbench": v.vbench,
                "videos": [m.to_json() for m in v.videos],
            }
            for v in report.variants
        ],
        "versus_dense": [
            {
                "label": v.label,
                "source": v.source,
                "density": v.density,
                "dropped_mass": v.dropped_mass,
                "mean": {k: float_to_json(x) for k, x in v.mean.items()},
                "videos": [m.to_json() for m in v.videos],
            }
            for v in report.versus_dense
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _finite_mean(vals: list[float]) -> float | None:
    finite = [x for x in vals if not math.isinf(x)]
    return float(np.mean(finite)) if finite else None


def plot_psnr_per_frame(report: EvalReport) -> bytes:
    """PNG bytes: per-frame PSNR of each variant (mean over videos; ∞ frames not drawn)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    any_inf = False
    for v in report.variants:
        length = max(len(m.psnr_per_frame) for m in v.videos)
        arr = np.full((len(v.videos), length), np.nan)
        for i, m in enumerate(v.videos):
            vals = np.asarray(m.psnr_per_frame, dtype=np.float64)
            any_inf |= bool(np.isinf(vals).any())
            arr[i, : len(vals)] = np.where(np.isinf(vals), np.nan, vals)
        with np.errstate(all="ignore"):
            counts = np.sum(~np.isnan(arr), axis=0)
            mean = np.where(counts > 0, np.nansum(arr, axis=0) / np.maximum(counts, 1), np.nan)
        label = v.label if not np.isnan(mean).all() else f"{v.label} (identical: ∞ dB)"
        ax.plot(np.arange(length), mean, marker="." if length <= 40 else None, label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("frame")
    ax.set_ylabel("PSNR (dB) vs reference")
    title = "Per-frame PSNR, mean over videos"
    if any_inf:
        title += " (identical frames, ∞ dB, not drawn)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def sample_indices(n_frames: int, k: int) -> list[int]:
    """``k`` frame indices spread evenly over ``n_frames`` (first and last included)."""
    k = max(1, min(k, n_frames))
    return sorted({int(round(x)) for x in np.linspace(0, n_frames - 1, k)})


def comparison_image(rows: list[tuple[str, Path]], *, samples: int = 4, tile_width: int = 256) -> bytes:
    """PNG bytes: one row per (label, video file), ``samples`` frames each, label on the left."""
    from PIL import Image, ImageDraw, ImageFont

    decoded = []
    for label, path in rows:
        frames = list(iter_frames(path))
        idx = sample_indices(len(frames), samples)
        decoded.append((label, [frames[i] for i in idx], idx))
    h0, w0 = decoded[0][1][0].shape[:2]
    tw = tile_width
    th = max(1, round(h0 * tw / w0))
    resample = Image.NEAREST if tw >= w0 else Image.BILINEAR  # small videos: show the pixels
    label_w, header_h = 160, 22
    ncols = max(len(f) for _, f, _ in decoded)
    canvas = Image.new("RGB", (label_w + ncols * tw, header_h + len(decoded) * th), "white")
    draw = ImageDraw.Draw(canvas)
    try:
        font = ImageFont.load_default(size=14)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    for c, i in enumerate(decoded[0][2]):
        draw.text((label_w + c * tw + 4, 3), f"frame {i}", fill="black", font=font)
    for r, (label, frames, _) in enumerate(decoded):
        y = header_h + r * th
        draw.text((4, y + th // 2 - 7), label[:22], fill="black", font=font)
        for c, f in enumerate(frames):
            tile = Image.fromarray(f).resize((tw, th), resample)
            canvas.paste(tile, (label_w + c * tw, y))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    return buf.getvalue()


def write_report(
    folder: str | Path,
    report: EvalReport,
    *,
    comparison_rows: list[tuple[str, Path]] | None = None,
    comparison_video: str | None = None,
    samples: int = 4,
) -> dict[str, Path]:
    """Write the report folder (see the module doc); returns {file kind: path}.

    ``comparison_rows``: (label, video file) rows of the comparison image, reference first.
    When matplotlib is missing the plot is not written and the report says so (a note).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    images: dict[str, str] = {}
    try:
        png = plot_psnr_per_frame(report)
    except ImportError:
        report.notes.append("psnr_per_frame.png not written: matplotlib is not installed (pip install 'rotvid[plot]')")
        logger.warning("matplotlib is not installed: the per-frame PSNR plot is not written")
    else:
        written["plot"] = write_file_atomically(folder / "psnr_per_frame.png", png)
        images["Per-frame PSNR"] = "psnr_per_frame.png"
    if comparison_rows:
        written["comparison"] = write_file_atomically(
            folder / "comparison.png", comparison_image(comparison_rows, samples=samples)
        )
        images[f"Sampled frames of {comparison_video or comparison_rows[0][1].stem}"] = "comparison.png"
    written["csv"] = write_file_atomically(folder / "metrics.csv", metrics_csv(report))
    written["json"] = write_file_atomically(folder / "metrics.json", metrics_json(report))
    written["markdown"] = write_file_atomically(folder / "report.md", report_markdown(report, images=images))
    return written
