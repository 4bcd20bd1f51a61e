"""`rotvid generate`: video(s) with quantized self-attention."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

import rotvid.cli.pipeline as pipeline
from rotvid.cli.app import DEFAULT_MODEL, app
from rotvid.cli.errors import user_errors
from rotvid.cli.options import (
    BackendOpt, CompileOpt, DenseBlocksOpt, DenseFirstStepsOpt, DeviceOpt, DtypeOpt, FpsOpt, FramesOpt, GpusOpt,
    GuidanceOpt, HeightOpt, ImageOpt, MaxSeqOpt, ModelOpt, NegOpt, OverwriteOpt, QuietOpt, ScheduleOpt, SeedOpt,
    SmoothKOpt, SmoothQOpt, SmoothVOpt, SparsityOpt, StepsOpt, WidthOpt, base_config, check_dtype_device,
    check_model, dense_rules, parse_schedule, read_prompts,
)
from rotvid.cli.progress import StepProgress
from rotvid.cli.request import check_request_before_loading, request_template
from rotvid.cli.workers import finish_workers, join_workers, launch_workers


@app.command()
def generate(
    ctx: typer.Context,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="The text prompt.")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="Text file, one prompt per "
                                                        "line: one video each.")] = None,
    model: ModelOpt = DEFAULT_MODEL,
    image: ImageOpt = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="A RotvidConfig JSON (e.g. from rotvid "
                                                   "calibrate); --recipe/--rotation/--schedule/--smooth-*/--sparsity "
                                                   "override it.")] = None,
    recipe: Annotated[Optional[str], typer.Option(help="Attention recipe: auto (per GPU: int8-fp8 on Hopper, int4 "
                                                  "on Ampere/Ada and the CPU; `rotvid backends` shows the choice), "
                                                  "int4, int4-sym-p, int8-fp8, int4-fp8, nvfp4, or fp16 (untouched "
                                                  "pipeline) (default: auto).")] = None,
    rotation: Annotated[Optional[str], typer.Option(help="Q/K rotation: none, interleaved, half, full, "
                                                    "learned:FILE (default: half).")] = None,
    schedule: ScheduleOpt = None,
    backend: BackendOpt = None,
    smooth_k: SmoothKOpt = None,
    smooth_q: SmoothQOpt = None,
    smooth_v: SmoothVOpt = None,
    steps: StepsOpt = None,
    height: HeightOpt = None,
    width: WidthOpt = None,
    frames: FramesOpt = None,
    guidance_scale: GuidanceOpt = None,
    negative_prompt: NegOpt = None,
    max_sequence_length: MaxSeqOpt = None,
    seed: SeedOpt = 0,
    fps: FpsOpt = None,
    dtype: DtypeOpt = "bf16",
    device: DeviceOpt = "auto",
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output .mp4 (one prompt) or folder (several "
                                                "prompts) (default: rotvid.mp4 / rotvid-videos).")] = None,
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
    gpus: GpusOpt = 1,
    compile: CompileOpt = False,
    sparsity: SparsityOpt = None,
    dense_first_steps: DenseFirstStepsOpt = None,
    dense_blocks: DenseBlocksOpt = None,
) -> None:
    """Generate video(s) with quantized self-attention (recipe auto: this GPU's); writes an H.264 mp4 and a JSON
    sidecar per prompt."""
    with user_errors():
        from rotvid.eval.generation import (
            call_kwargs, check_outputs, finished, generate_video, read_sidecar, request_record, video_name,
        )
        from rotvid.pipelines.config import RotvidConfig
        from rotvid.pipelines.pipeline_config import default_schedule
        from rotvid.pipelines.schedule import Schedule
        from rotvid.request_checks import (
            check_backend_device, check_output_file, check_output_folder, steps_of_schedule,
        )

        prompts = read_prompts(prompt, prompt_file)
        check_model(model)
        check_dtype_device(dtype, device)
        template = request_template(seed=seed, negative_prompt=negative_prompt, image=image, height=height,
                                     width=width, frames=frames, steps=steps, guidance_scale=guidance_scale,
                                     max_sequence_length=max_sequence_length, fps=fps)
        if len(prompts) == 1 and prompt_file is None:
            out = out or Path("rotvid.mp4")
            if out.suffix.lower() != ".mp4":
                raise ValueError(f"--out: expected a file name ending in .mp4 for one prompt, got {out}")
            if out.is_dir():
                raise ValueError(f"--out {out}: is a folder; expected an .mp4 file name for one prompt")
            check_output_file("--out", out)
            outputs = [out]
        else:
            out = out or Path("rotvid-videos")
            if out.suffix.lower() == ".mp4":
                raise ValueError(f"--out: expected a folder for a prompt file ({len(prompts)} prompts), got {out}")
            check_output_folder("--out", out)
            outputs = [out / f"{video_name(i, p)}.mp4" for i, p in enumerate(prompts)]
        resuming = prompt_file is not None and not overwrite  # a prompt file's finished videos are kept
        for o in outputs:
            if resuming and o.exists() and read_sidecar(o) is not None:
                continue  # compared with this run's request once the config is known (finished() below)
            check_outputs(o, overwrite=overwrite)
        options = dict(base=base_config(config), recipe=recipe, rotation=rotation,
                       schedule=parse_schedule(schedule, steps), backend=backend, smooth_k=smooth_k,
                       smooth_q=smooth_q, smooth_v=smooth_v, sparsity=sparsity,
                       dense=dense_rules(dense_first_steps, dense_blocks))
        # checked without loading anything: on the default schedule where the family's would be chosen
        cfg = RotvidConfig.from_options(**options, family_schedule=Schedule())
        if cfg is not None:
            check_backend_device(cfg.backend, device, "--backend" if backend is not None else f"--config {config}: backend")
            template = replace(template, steps=steps_of_schedule(
                cfg.schedule, steps, f"--schedule {schedule}" if schedule is not None else f"--config {config}"))
        check_request_before_loading(model, replace(template, prompt=prompts[0]), device, dtype)
        if resuming:  # a finished video of another request: refused now, not after loading
            _check_resume(options, model, template, prompts, outputs)
        if launch_workers(ctx, gpus, device):
            return
        worker = join_workers(gpus, device)
        quiet = quiet or (worker is not None and worker.rank != 0)  # progress from rank 0 only

        with StepProgress(quiet) as bar:
            bar.log(f"loading {model} ...")
            pipe = pipeline.load(model, dtype, device, worker)
            pipeline.note_if_cpu(bar, pipe)
            call_kwargs(pipe, replace(template, prompt=prompts[0]))  # --image vs the pipeline, before any work
            if cfg is not None:
                cfg = RotvidConfig.from_options(**options, family_schedule=lambda: default_schedule(model, pipe))
            for i, (p, o) in enumerate(zip(prompts, outputs)):
                request = replace(template, prompt=p)
                if resuming and finished(o, request_record(model, request, cfg.to_dict() if cfg is not None else None)):
                    bar.log(f"kept {o} (already generated by the same request)")
                    continue
                bar.start(f"[{i + 1}/{len(prompts)}] {o.name}")
                if compile:
                    from rotvid.pipelines.compiling import COMPILE_MESSAGE

                    bar.log(COMPILE_MESSAGE)
                side = generate_video(pipe, request, o, model=model, config=cfg,
                                      overwrite=overwrite, on_step=bar.step, compile=compile)
                if not quiet:
                    from rotvid.pipelines.report import nothing_quantized_reason

                    t = side["timing"]
                    bar.log(f"wrote {o} ({side['frames']} frames {side['width']}x{side['height']}, "
                            f"{t['total_seconds']:.1f} s, {side['recipe']} calls {100 * side['quantized_fraction']:.0f}%, "
                            f"fallback calls {sum(side['fallbacks'].values())})")
                    why = nothing_quantized_reason(side["run_report"], _schedule_name(cfg))
                    if why is not None:
                        bar.log(f"note: {why}")
        finish_workers(worker)


def _check_resume(options: dict, model, template, prompts, outputs) -> None:
    """``generate --prompt-file`` resuming: every finished video must come from this run's request (the
    differences named), checked before loading where the config can be told without the pipeline."""
    from rotvid.eval.generation import finished, request_record
    from rotvid.pipelines.config import NeedsPipeline, RotvidConfig
    from rotvid.pipelines.pipeline_config import default_schedule

    try:
        cfg = RotvidConfig.from_options(**options, family_schedule=lambda: default_schedule(model))
    except NeedsPipeline:  # a hub id the model table does not know: checked once loaded
        return
    for p, o in zip(prompts, outputs):
        if o.exists():
            finished(o, request_record(model, replace(template, prompt=p), cfg.to_dict() if cfg is not None else None))


def _schedule_name(cfg) -> str | None:
    schedule = getattr(cfg, "schedule", None)
    return getattr(schedule, "name", None) if schedule is not None and not isinstance(schedule, str) else schedule
