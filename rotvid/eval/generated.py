"""The generating form of ``rotvid eval``: FP16 reference and variants from the same seed, then compare.

Folder layout under ``out``::

    videos/reference/NAME.mp4 (+ NAME.json)   the untouched pipeline (FP16 attention)
    videos/<variant>/NAME.mp4 (+ NAME.json)   one folder per variant, e.g. int4_half
    report.md, metrics.csv, metrics.json, psnr_per_frame.png, comparison.png

NAME is ``video_name(i, prompt)``. Every video of one prompt uses the same seed (so the same
initial noise: the sidecars carry its hash). Resuming: a video whose mp4 and sidecar exist with
the same request is not generated again; one from a different request is an error unless
``overwrite``. The report files are derived from the videos and are rewritten on every run.
The pipeline is loaded only when at least one video is missing. A sparse variant (one with a block map) whose dense
twin -- the same recipe and rotation without a map -- is among the variants is also measured against that twin's
videos (``report.versus_dense``): what the map alone changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rotvid.eval.compare import VBenchRequest, add_vbench, measure
from rotvid.eval.generation import GenerationRequest, finished, generate_video, request_record, video_name
from rotvid.eval.matching import CandidateSet, VideoPair
from rotvid.eval.report import EvalReport, write_report
from rotvid.eval.variants import VariantSpec

logger = logging.getLogger(__name__)

REFERENCE_FOLDER = "reference"


@dataclass
class PlannedVideo:
    """One video of the plan: which variant (``None``: reference), prompt index, path, request."""

    variant: VariantSpec | None
    index: int
    request: GenerationRequest
    path: Path
    config_dict: dict | None
    done: bool = False


class GenerationEvents:
    """Hooks for progress display; the defaults do nothing."""

    def loading(self, model: str) -> None: ...

    def video_started(self, label: str, name: str, index: int, total: int) -> None: ...

    def step(self, done: int, total: int) -> None: ...

    def video_done(self, path: Path, skipped: bool) -> None: ...

    def measuring(self, label: str, name: str) -> None: ...

    def vbench(self, line: str) -> None: ...


def plan_videos(
    out: Path,
    prompts: Sequence[str],
    variants: Sequence[VariantSpec],
    template: GenerationRequest,
    *,
    model: str,
    make_config: Callable[[VariantSpec], object],
    overwrite: bool,
) -> list[PlannedVideo]:
    """Every video of the eval (reference first), each marked ``done`` if it can be reused."""
    plan = []
    for variant in [None, *variants]:
        folder = out / "videos" / (REFERENCE_FOLDER if variant is None else variant.label)
        config = None if variant is None else make_config(variant)
        config_dict = None if config is None else config.to_dict()
        for i, prompt in enumerate(prompts):
            request = replace(template, prompt=prompt)
            path = folder / f"{video_name(i, prompt)}.mp4"
            item = PlannedVideo(variant, i, request, path, config_dict)
            item.done = not overwrite and finished(path, request_record(model, request, config_dict))
            plan.append(item)
    return plan


def _paired_by_prompt(out: Path, plan: list[PlannedVideo], candidate: VariantSpec, reference: VariantSpec | None,
                      name: str) -> CandidateSet:
    """``candidate``'s planned videos, each paired with the video of the same prompt from ``reference`` (``None``:
    the untouched pipeline), as the candidate set ``name``."""

    def videos_of(variant: VariantSpec | None) -> list[PlannedVideo]:
        label = None if variant is None else variant.label
        return [p for p in plan if (None if p.variant is None else p.variant.label) == label]

    ref_paths = {p.index: p.path for p in videos_of(reference)}
    pairs = tuple(VideoPair(name=p.path.stem, reference=ref_paths[p.index], candidate=p.path)
                  for p in videos_of(candidate))
    return CandidateSet(variant=name, source=out / "videos" / candidate.label, pairs=pairs)


def _versus_dense(out: Path, plan: list[PlannedVideo], variants: Sequence[VariantSpec], ev: GenerationEvents):
    """Each sparse variant measured against its dense twin, when the twin is one of the variants too."""
    labels = {v.label for v in variants}
    sets = [_paired_by_prompt(out, plan, v, v.dense_twin, f"{v.label} vs {v.dense_twin.label}")
            for v in variants if v.sparsity.enabled and v.dense_twin.label in labels]
    if not sets:
        return []
    return measure("dense twins", str(out / "videos"), sets, on_video=ev.measuring).variants


def evaluate_generated(
    prompts: Sequence[str],
    variants: Sequence[VariantSpec],
    out: str | Path,
    template: GenerationRequest,
    *,
    model: str,
    load: Callable[[], object],
    make_config: Callable[[VariantSpec], object],
    overwrite: bool = False,
    vbench: VBenchRequest | None = None,
    samples: int = 4,
    events: GenerationEvents | None = None,
    compile: bool = False,
) -> tuple[EvalReport, dict[str, Path]]:
    """Generate what is missing, then measure every variant against the reference.

    ``load()`` returns the pipeline (called at most once, only if something must be generated);
    ``make_config(spec)`` builds the :class:`RotvidConfig` of a variant. ``compile``: every video
    (the reference too) runs with its transformer(s) under ``torch.compile``. In a multi-process run
    (``rotvid eval --gpus N``) every rank generates; rank 0 alone measures and returns the report
    (the others return ``(None, {})``).
    """
    from rotvid.distributed_run import barrier, is_main_process
    from rotvid.eval.vbench_runner import check_weights

    ev = events or GenerationEvents()
    out = Path(out)
    if not prompts:
        raise ValueError("prompts: expected at least one prompt")
    if not variants:
        raise ValueError("--variants: expected at least one variant")
    if vbench is not None:
        check_weights(vbench.dimensions, vbench.cache_dir)
    plan = plan_videos(out, prompts, variants, template, model=model, make_config=make_config, overwrite=overwrite)
    barrier()  # every rank plans before rank 0 writes anything (the same plan on every rank)
    todo = [p for p in plan if not p.done]
    pipe = None
    if todo:
        ev.loading(model)
        pipe = load()
    configs = {v.label: make_config(v) for v in variants}
    for n, item in enumerate(plan):
        label = REFERENCE_FOLDER if item.variant is None else item.variant.label
        ev.video_started(label, item.path.stem, n, len(plan))
        if item.done:
            ev.video_done(item.path, True)
            continue
        config = None if item.variant is None else configs[item.variant.label]
        generate_video(pipe, item.request, item.path, model=model, config=config, overwrite=overwrite,
                       on_step=ev.step, extra={"eval_variant": label}, compile=compile)
        ev.video_done(item.path, False)
    if not is_main_process():  # multi-process generation: rank 0 alone measures and writes the report
        return None, {}
    sets = [_paired_by_prompt(out, plan, v, None, v.label) for v in variants]
    report = measure("reference", str(out / "videos" / REFERENCE_FOLDER), sets,
                     columns={v.label: v.table_columns() for v in variants}, on_video=ev.measuring)
    report.versus_dense = _versus_dense(out, plan, variants, ev)
    # the reference is the untouched pipeline in the dtype that ran (BF16 when bf16 ran, not "FP16")
    report.reference_label = f"{report.reference_columns[0]} (reference)"
    report.meta.update({"model": model, "prompts": len(prompts), "seed": template.seed,
                        "variants": ", ".join(v.spec for v in variants)})
    report.meta.update({k: report.reference_run[k] for k in ("device", "dtype", "steps") if k in report.reference_run})
    if vbench is not None:
        add_vbench(report, sets, vbench, progress=ev.vbench)
    first = sets[0].pairs[0]
    rows = [(report.reference_label, first.reference)] + [(cs.variant, cs.pairs[0].candidate) for cs in sets]
    written = write_report(out, report, comparison_rows=rows, comparison_video=first.name, samples=samples)
    return report, written
