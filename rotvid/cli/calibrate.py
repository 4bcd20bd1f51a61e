"""`rotvid calibrate`: learn per-block rotations and an adaptive FP16 schedule from a few prompts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

import rotvid.cli.pipeline as pipeline
from rotvid.cli.app import DEFAULT_MODEL, app
from rotvid.cli.errors import user_errors
from rotvid.cli.options import (
    BackendOpt, DenseBlocksOpt, DeviceOpt, DtypeOpt, FramesOpt, GuidanceOpt, HeightOpt,
    ImageOpt, MaxSeqOpt, ModelOpt, NegOpt, OverwriteOpt, QuietOpt, SeedOpt, StepsOpt, WidthOpt, check_backend,
    check_dtype_device, check_model, check_positive, dense_rules,
)
from rotvid.cli.progress import StepProgress
from rotvid.cli.request import check_request_before_loading, request_template


@app.command()
def calibrate(
    prompt_file: Annotated[Path, typer.Option("--prompt-file", help="Calibration prompts, one per line.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder: rotations.safetensors, "
                                      "schedule.json, summary.json.")],
    model: ModelOpt = DEFAULT_MODEL,
    image: ImageOpt = None,
    pairing: Annotated[str, typer.Option(help="Pairs the 2x2 blocks act on: half or interleaved.")] = "half",
    per_head: Annotated[bool, typer.Option("--per-head", help="One set of blocks per head.")] = False,
    iters: Annotated[int, typer.Option(help="Adam iterations per block.")] = 200,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 0.01,
    objective: Annotated[str, typer.Option(help="scores (paper Eq. 9) or output (INT4 attention output "
                                           "error through the fake-quantized attention).")] = "scores",
    unconstrained: Annotated[bool, typer.Option("--unconstrained", help="Learn general invertible blocks "
                                                "(the paper's ablation; not installable).")] = False,
    max_tokens: Annotated[int, typer.Option(help="Tokens captured per call and used per block.")] = 1024,
    capture_steps: Annotated[Optional[str], typer.Option(help="Comma-separated denoising steps to capture Q/K "
                                                         "at (default: all).")] = None,
    dump_dir: Annotated[Optional[Path], typer.Option(help="Also write each captured call's full Q/K/V as a "
                                                     "tensor dump here (for benchmarks/accuracy_study.py --dump; "
                                                     "large: use --capture-steps).")] = None,
    cosine_floor: Annotated[Optional[float], typer.Option(help="Keep FP16 every (step, block) whose INT4 "
                                                          "cosine vs FP16 is below this; with --sparsity topp:TAU, "
                                                          "also choose each block's tau (the lowest, from TAU up a "
                                                          "ladder, whose mean cosine reaches it; dense when none "
                                                          "does) and, with any --sparsity, the dense first steps "
                                                          "(see --dense-first-steps).")] = None,
    target_quantized: Annotated[Optional[float], typer.Option(
        "--target-quantized", help="Keep the worst cells FP16 until at most this fraction runs the quantized "
        "recipe (default 0.8 unless --cosine-floor is given).")] = None,
    target_int4: Annotated[Optional[float], typer.Option(
        "--target-int4", hidden=True, help="Deprecated: the old name of --target-quantized.")] = None,
    recipe: Annotated[str, typer.Option(help="Recipe the schedule is chosen for: auto (this GPU's, see `rotvid "
                                        "backends`) or a quantized recipe.")] = "auto",
    backend: BackendOpt = None,
    steps: StepsOpt = None,
    height: HeightOpt = None,
    width: WidthOpt = None,
    frames: FramesOpt = None,
    guidance_scale: GuidanceOpt = None,
    negative_prompt: NegOpt = None,
    max_sequence_length: MaxSeqOpt = None,
    seed: SeedOpt = 0,
    dtype: DtypeOpt = "bf16",
    device: DeviceOpt = "auto",
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
    sparsity: Annotated[Optional[str], typer.Option("--sparsity", help="The block map the schedule is chosen for "
                                                    "(none, radial[:...], topp:TAU[,sim=FLOAT]): the probe measures "
                                                    "the quantized calls under it, and schedule.json records the "
                                                    "map of each block.")] = None,
    dense_first_steps: Annotated[Optional[int], typer.Option(
        "--dense-first-steps", help="With a block map: the first N denoising steps run dense (no map). Default: "
        "chosen with --cosine-floor (from 0 up to a quarter of the steps: the count whose sparse calls reach the "
        "floor at every step with the highest expected speed-up), else 0.")] = None,
    dense_blocks: DenseBlocksOpt = None,
) -> None:
    """Learn per-block rotations and an adaptive FP16 schedule from a few prompts.

    Use the result with: rotvid generate --rotation learned:OUT/rotations.safetensors
    --schedule OUT/schedule.json (same --steps as here).
    """
    with user_errors():
        from rotvid.eval.generation import call_kwargs, load_prompts
        from rotvid.pipelines.calibrate import CalibrationOptions, calibrate as run_calibration
        from rotvid.kernels.recipes import AUTO, quantized_recipe_names
        from rotvid.kernels.sparsity import parse_sparsity
        from rotvid.pipelines.config import check_dense_has_block_map

        if not prompt_file.is_file():
            raise FileNotFoundError(f"--prompt-file {prompt_file} does not exist")
        prompts = load_prompts(prompt_file)
        check_model(model)
        check_dtype_device(dtype, device)
        if pairing not in ("half", "interleaved"):
            raise ValueError(f"--pairing: expected half or interleaved, got {pairing!r}")
        if objective not in ("scores", "output"):
            raise ValueError(f"--objective: expected scores or output, got {objective!r}")
        if recipe != AUTO and recipe not in quantized_recipe_names():
            raise ValueError(f"--recipe: expected auto or a quantized recipe ({', '.join((AUTO, *quantized_recipe_names()))}), got {recipe!r}")
        check_positive("--iters", iters)
        check_positive("--lr", lr)
        check_positive("--max-tokens", max_tokens)
        if target_int4 is not None:  # the old name, accepted for one version
            if target_quantized is not None:
                raise ValueError("--target-quantized: expected it or its old name --target-int4, not both")
            typer.echo("Warning: --target-int4 is deprecated (it is the quantized fraction for every recipe); "
                       "use --target-quantized", err=True)
            target_quantized = target_int4
        if cosine_floor is None and target_quantized is None:
            target_quantized = 0.8
        if target_quantized is not None and not 0.0 <= target_quantized <= 1.0:
            raise ValueError(f"--target-quantized: expected a fraction in [0, 1], got {target_quantized}")
        if cosine_floor is not None and not -1.0 <= cosine_floor <= 1.0:
            raise ValueError(f"--cosine-floor: expected a cosine in [-1, 1], got {cosine_floor}")
        check_backend(backend)
        from rotvid.request_checks import check_backend_device, check_output_folder

        check_backend_device(backend, device)
        check_output_folder("--out", out)
        if dump_dir is not None:
            check_output_folder("--dump-dir", dump_dir)
        if not overwrite:  # every file this run writes, checked before hours of work
            names = ("rotations_unconstrained.safetensors" if unconstrained else "rotations.safetensors",
                     "schedule.json", "summary.json")
            for name in names:
                if (out / name).exists():
                    raise FileExistsError(f"{out / name} exists; pass --overwrite to replace it")
            if dump_dir is not None and dump_dir.is_dir() and any(dump_dir.glob("*.safetensors")):
                raise FileExistsError(f"--dump-dir {dump_dir}: holds tensor dumps that this run would overwrite "
                                      "(numbered from 0000); pass --overwrite or another folder")
        template = request_template(seed=seed, negative_prompt=negative_prompt, image=image, height=height,
                                     width=width, frames=frames, steps=steps, guidance_scale=guidance_scale,
                                     max_sequence_length=max_sequence_length, fps=None)
        check_request_before_loading(model, replace(template, prompt=prompts[0]), device, dtype)
        steps_set = None
        if capture_steps is not None:
            try:
                steps_set = {int(x) for x in capture_steps.split(",") if x.strip()}
            except ValueError:
                raise ValueError(f"--capture-steps: expected comma-separated step numbers, got {capture_steps!r}") from None
            if not steps_set or min(steps_set) < 0:
                raise ValueError(f"--capture-steps: expected non-negative step numbers, got {capture_steps!r}")
        dense = dense_rules(dense_first_steps, dense_blocks)
        spec = parse_sparsity(sparsity if sparsity is not None else "none")
        check_dense_has_block_map(dense, spec.enabled)
        if spec.enabled and unconstrained:
            raise ValueError("--sparsity: the unconstrained rotation is not installable, so no schedule is probed "
                             "(drop --unconstrained or --sparsity)")
        options = CalibrationOptions(
            capture_steps=steps_set, dump_dir=dump_dir, model_name=model,
            pairing=pairing, per_head=per_head, iters=iters, lr=lr, objective=objective, unconstrained=unconstrained,
            max_tokens=max_tokens, recipe=recipe, backend=backend or "auto", cosine_floor=cosine_floor,
            target_quantized_fraction=target_quantized, seed=seed, sparsity=spec, **dense,
        )
        with StepProgress(quiet) as bar:
            bar.log(f"loading {model} ...")
            pipe = pipeline.load(model, dtype, device)
            pipeline.note_if_cpu(bar, pipe)
            first = call_kwargs(pipe, replace(template, prompt=prompts[0]))  # --image vs the pipeline, before work
            n_steps = first.get("num_inference_steps", _call_default(pipe, "num_inference_steps"))
            if steps_set is not None and isinstance(n_steps, int) and max(steps_set) >= n_steps:
                raise ValueError(f"--capture-steps: step {max(steps_set)} is past the run's {n_steps} steps "
                                 f"(0 .. {n_steps - 1})")
            if dump_dir is not None:
                options.video_size = _video_size(pipe, first)

            def call(p, text):
                kw = call_kwargs(p, replace(template, prompt=text))
                kw["output_type"] = "latent"
                return p(**kw)

            result = run_calibration(pipe, prompts, out, call=call, options=options, progress=bar.log)
        if not quiet:
            _print_calibration(result)


def _call_default(pipe, arg: str):
    """The default of ``arg`` in ``pipe.__call__`` (None when it has none)."""
    import inspect

    param = inspect.signature(pipe.__call__).parameters.get(arg)
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def _video_size(pipe, kwargs: dict) -> tuple[int, int, int]:
    """(height, width, frames) of a call: its arguments, else the pipeline's defaults."""
    size = []
    for arg in ("height", "width", "num_frames"):
        value = kwargs.get(arg, _call_default(pipe, arg))
        if not isinstance(value, int):
            raise ValueError(f"--{'frames' if arg == 'num_frames' else arg}: needed for --dump-dir "
                             f"({type(pipe).__name__} has no default)")
        size.append(value)
    return tuple(size)


def _print_calibration(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rotvid calibrate: objective per block (lower is better)")
    for col in ("transformer", "block", "H2 init", "learned"):
        table.add_column(col, justify="right")
    for row in result.blocks:
        table.add_row(row.transformer, str(row.block), f"{row.objective_init:.4g}", f"{row.objective_final:.4g}")
    console = Console()
    console.print(table)
    console.print(f"rotations: {result.rotations_path}")
    if result.dumps:
        console.print(f"dumps:     {len(result.dumps)} files in {result.dumps[0].parent}")
    if result.schedule is not None:
        n = sum(len(c) for c in result.fp16_cells.values())
        console.print(f"schedule:  {result.schedule_path} ({n} FP16 (step, block) cells, "
                      f"{(result.recipe or 'quantized').upper()} fraction {result.quantized_fraction:.1%})")
    if result.block_sparsity:
        maps = ", ".join(f"{b}: {spec}" for b, spec in sorted(result.block_sparsity.items()))
        console.print(f"block maps: {maps}")
        _print_block_maps(console, result)


def _print_block_maps(console, result) -> None:
    """The chosen maps' density and kept mass against the oracle's, the dense first steps and the speed-up."""
    from rich.table import Table

    from rotvid.kernels.sparsity.cost import ESTIMATE_BASIS

    if result.block_map_measures:
        table = Table(title="block maps: attention mass kept (oracle: the most a map with the same block counts keeps)")
        for col in ("block", "map", "density", "kept mass", "oracle kept mass"):
            table.add_column(col, justify="right")
        for b, row in sorted(result.block_map_measures.items()):
            table.add_row(str(b), result.block_sparsity.get(b, ""), f"{row['density']:.3f}", f"{row['kept_mass']:.4f}",
                          f"{row['oracle_kept_mass']:.4f}")
        console.print(table)
        console.print(f"kept mass: {result.mean_kept_mass:.4f} (oracle at the same block counts "
                      f"{result.mean_oracle_kept_mass:.4f}), mean over the blocks with a map")
    console.print(f"dense first steps: {result.dense_first_steps} ({result.dense_first_steps_rule})")
    console.print(f"expected attention speed-up: {result.expected_speedup:.2f}x ({ESTIMATE_BASIS})")
