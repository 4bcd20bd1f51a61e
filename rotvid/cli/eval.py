"""`rotvid eval`: compare videos with the FP16 reference (and generate them first, from --variants)."""

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
    SmoothKOpt, SmoothQOpt, SmoothVOpt, StepsOpt, WidthOpt, check_backend, check_dtype_device, check_model,
    dense_rules, parse_schedule,
)
from rotvid.cli.progress import EvalEvents, StepProgress
from rotvid.cli.request import check_request_before_loading, request_template
from rotvid.cli.workers import finish_workers, join_workers, launch_workers


@app.command("eval")
def eval_(
    ctx: typer.Context,
    reference: Annotated[Optional[Path], typer.Argument(help="Reference video, or folder of videos.",
                                                        show_default=False)] = None,
    candidates: Annotated[Optional[list[Path]], typer.Argument(help="Candidate video(s) or folder(s), matched "
                                                               "to the reference by file name.",
                                                               show_default=False)] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="Generate: one prompt per "
                                                        "line.")] = None,
    variants: Annotated[Optional[str], typer.Option(help="Generate: RECIPE:ROTATION[:SPARSITY],... e.g. "
                                                    "int4:half,int8-fp8:half,int8-fp8:half:topp0.9; RECIPE auto is "
                                                    "this GPU's recipe (see `rotvid backends`); SPARSITY a block map "
                                                    "written without ':' (topp0.9, topp0.9+sim=0.3, radial, "
                                                    "radial+band=2, none).")] = None,
    model: ModelOpt = DEFAULT_MODEL,
    image: ImageOpt = None,
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
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder (generated videos go under "
                                      "OUT/videos).")] = Path("rotvid-eval"),
    vbench: Annotated[Optional[str], typer.Option("--vbench", help="VBench dimensions to add, e.g. "
                                                  "temporal_flickering,subject_consistency.")] = None,
    vbench_python: Annotated[Optional[Path], typer.Option("--vbench-python", help="Python of the VBench "
                                                          "environment (default: $ROTVID_VBENCH_PYTHON, else the "
                                                          "one `rotvid vbench-setup` makes).")] = None,
    vbench_device: Annotated[str, typer.Option(help="Device for VBench: auto, cuda or cpu.")] = "auto",
    samples: Annotated[int, typer.Option(help="Frames per row of comparison.png.")] = 4,
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
    gpus: GpusOpt = 1,
    compile: CompileOpt = False,
    sparsity: Annotated[Optional[str], typer.Option("--sparsity", help="Generate: the block map of the variants "
                                                    "that name none (RECIPE:ROTATION without :SPARSITY); default "
                                                    "none.")] = None,
    dense_first_steps: DenseFirstStepsOpt = None,
    dense_blocks: DenseBlocksOpt = None,
) -> None:
    """Compare videos with the FP16 reference: PSNR, SSIM, cosine, MSE (and VBench); writes a report folder.

    Either `rotvid eval REFERENCE CANDIDATE...` on existing videos, or
    `rotvid eval --prompt-file F --model M --variants int4:half,...` which generates the FP16
    reference and every variant from the same seed first (resuming: finished videos are kept).
    """
    with user_errors():
        from rotvid.eval.compare import VBenchRequest, evaluate_paths
        from rotvid.eval.report import summary_table

        generating = prompt_file is not None or variants is not None
        if generating and reference is not None:
            raise ValueError("REFERENCE/CANDIDATE and --prompt-file/--variants: use one form of eval, not both")
        if not generating and reference is None:
            raise ValueError("REFERENCE: expected REFERENCE CANDIDATE... or --prompt-file F --variants V,...")
        if samples < 1:
            raise ValueError(f"--samples: expected a positive count, got {samples}")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: expected a folder for the report, got a file")
        from rotvid.request_checks import check_output_folder

        check_output_folder("--out", out)
        if vbench_device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"--vbench-device: expected auto, cuda or cpu, got {vbench_device!r}")
        vb = None
        if vbench is not None:
            from rotvid.eval.vbench_runner import parse_dimensions, resolve_vbench_python, vbench_cache_dir

            vb = VBenchRequest(dimensions=parse_dimensions(vbench), python=resolve_vbench_python(vbench_python),
                               device=vbench_device, cache_dir=vbench_cache_dir())
        worker = None
        if gpus != 1:
            if not generating:
                raise ValueError(f"--gpus {gpus}: only when eval generates (--prompt-file/--variants)")
            if launch_workers(ctx, gpus, device):
                return
            worker = join_workers(gpus, device)
            quiet = quiet or worker.rank != 0  # progress and the summary from rank 0 only
        with StepProgress(quiet) as bar:
            if generating:
                report, written = _eval_generated(
                    worker, bar, prompt_file=prompt_file, variants=variants, model=model, image=image, schedule=schedule,
                    backend=backend, smoothing=dict(smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v),
                    steps=steps, height=height, width=width, frames=frames,
                    guidance_scale=guidance_scale, negative_prompt=negative_prompt,
                    max_sequence_length=max_sequence_length, seed=seed, fps=fps, dtype=dtype, device=device,
                    out=out, vbench=vb, samples=samples, overwrite=overwrite, compile=compile, sparsity=sparsity,
                    dense=dense_rules(dense_first_steps, dense_blocks))
            else:
                _refuse_generation_options(ctx)
                if not candidates:
                    raise ValueError("CANDIDATE: expected at least one candidate video or folder after REFERENCE")
                events = EvalEvents(bar)
                report, written = evaluate_paths(reference, candidates, out, overwrite=overwrite, vbench=vb,
                                                 samples=samples, on_video=events.measuring, on_vbench=events.vbench)
        if not quiet and report is not None:
            typer.echo(summary_table(report))
            typer.echo(f"report: {written['markdown']}")
        finish_workers(worker)


_EVAL_GENERATION_ONLY = ("model", "image", "schedule", "backend", "smooth_k", "smooth_q", "smooth_v", "steps", "height",
                         "width", "frames", "guidance_scale", "negative_prompt", "max_sequence_length", "seed", "fps",
                         "dtype", "device", "compile", "sparsity", "dense_first_steps", "dense_blocks")


def _refuse_generation_options(ctx: typer.Context) -> None:
    """eval on existing videos: a generation option given on the command line would be ignored; refuse it."""
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)  # (by name: typer may carry its own click's enum)
        if param.name in _EVAL_GENERATION_ONLY and getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT"):
            negative = ctx.params.get(param.name) is False and getattr(param, "secondary_opts", None)
            name = param.secondary_opts[0] if negative else param.opts[0]
            raise ValueError(f"{name}: only with --prompt-file/--variants (eval on existing videos generates nothing)")


def _eval_generated(worker, bar, *, prompt_file, variants, model, image, schedule, backend, smoothing, steps, height,
                    width, frames,
                    guidance_scale, negative_prompt, max_sequence_length, seed, fps, dtype, device, out, vbench,
                    samples, overwrite, compile=False, sparsity=None, dense=None):
    from rotvid.eval.generated import evaluate_generated
    from rotvid.eval.variants import parse_variants, resolve_auto_variants

    if prompt_file is None:
        raise ValueError("--prompt-file: expected a file of prompts (one per line) to generate from")
    if variants is None:
        raise ValueError("--variants: expected RECIPE:ROTATION,... e.g. int4:half,int4:none")
    check_backend(backend)
    from rotvid.eval.generation import load_prompts
    from rotvid.pipelines.config import NeedsPipeline, RotvidConfig, check_learned_file, dense_flags
    from rotvid.pipelines.pipeline_config import default_schedule
    from rotvid.pipelines.schedule import Schedule
    from rotvid.kernels.sparsity import parse_sparsity

    prompts = load_prompts(prompt_file)
    specs = parse_variants(variants, default_sparsity=parse_sparsity(sparsity) if sparsity is not None else None)
    for spec in specs:  # before any video is generated
        check_learned_file(f"--variants {spec.recipe}:", spec.rotation)
    check_model(model)
    check_dtype_device(dtype, device)
    specs, notes = resolve_auto_variants(specs, pipeline.run_device(device))
    for note in notes:
        bar.log(note)
    template = request_template(seed=seed, negative_prompt=negative_prompt, image=image, height=height, width=width,
                                 frames=frames, steps=steps, guidance_scale=guidance_scale,
                                 max_sequence_length=max_sequence_length, fps=fps)
    from rotvid.request_checks import check_backend_device, steps_of_schedule

    check_backend_device(backend, device)
    options = dict(schedule=parse_schedule(schedule, steps), backend=backend, **smoothing, dense=dense,
                   strict_dense=False)  # a variant without a block map runs dense
    template = replace(template, steps=steps_of_schedule(options["schedule"], steps, f"--schedule {schedule}"))
    for spec in specs:  # every variant's config, before any video is generated (on the default schedule)
        RotvidConfig.from_options(**{**options, "schedule": None}, recipe=spec.recipe, rotation=spec.rotation,
                                  sparsity=spec.sparsity, family_schedule=Schedule())
    if dense and not any(spec.sparsity.enabled for spec in specs):
        raise ValueError(f"{dense_flags(dense)}: sparsity rules, but no variant has a block map (add :SPARSITY to a "
                         "variant, e.g. int8-fp8:half:topp0.9, or pass --sparsity)")
    check_request_before_loading(model, replace(template, prompt=prompts[0]), device, dtype)
    state: dict = {}

    def load():
        if "pipe" not in state:
            state["pipe"] = pipeline.load(model, dtype, device, worker)
        return state["pipe"]

    def make_config(spec):
        variant = dict(options, recipe=spec.recipe, rotation=spec.rotation, sparsity=spec.sparsity)
        try:
            return RotvidConfig.from_options(**variant, family_schedule=lambda: default_schedule(model))
        except NeedsPipeline:  # a hub id the model table does not know: the loaded pipeline tells the family
            return RotvidConfig.from_options(**variant, family_schedule=lambda: default_schedule(model, load()))

    return evaluate_generated(prompts, specs, out, template, model=model, load=load, make_config=make_config,
                              overwrite=overwrite, vbench=vbench, samples=samples,
                              events=EvalEvents(bar, compiling=compile), compile=compile)
