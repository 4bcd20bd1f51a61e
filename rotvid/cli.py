"""The `rotvid` command line (typer). Commands are thin: they hand off to library functions.

Bad input (a missing file, an unknown model or variant, videos that do not match, an output that
exists) ends with one line on stderr, ``Error: ...``, and exit code 1 — never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from pathlib import Path
from dataclasses import replace
from typing import Annotated, Optional

import typer

from rotvid import __version__

app = typer.Typer(
    name="rotvid",
    help="Quantized self-attention (INT4 on Ampere/Ada, INT8/FP8 on Hopper) with RoPE-aware rotations for video "
    "diffusion transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_MODEL = "wan2.1-t2v-1.3b"
_STATE = {"verbose": False}


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details (INFO level).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the rotvid version and exit.")] = False,
) -> None:
    _STATE["verbose"] = verbose
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
    elif verbose:
        root.setLevel(logging.INFO)


@contextlib.contextmanager
def _user_errors():
    """Turn bad input into one line on stderr and exit code 1."""
    from rotvid.eval.vbench_runner import VBenchError

    try:
        yield
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
            PermissionError, VBenchError) as exc:
        _fail(exc)
    except OSError as exc:  # e.g. a hub id that cannot be fetched offline
        _fail(exc)
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not isinstance(exc, MemoryError) and not any(s in str(exc) for s in ("out of memory", "allocate memory")):
            raise
        _fail(RuntimeError(f"out of memory ({' '.join(str(exc).split())[:200]}): ask for a smaller --height, --width, "
                           "--frames or --max-sequence-length, or use a device with more memory"))
    except KeyboardInterrupt:
        typer.echo("Interrupted (finished videos are kept; run the same command again to resume: `rotvid eval` and "
                   "`rotvid generate --prompt-file` skip them).", err=True)
        raise typer.Exit(130) from None


def _fail(exc: BaseException) -> None:
    if _STATE["verbose"]:  # --verbose: the traceback too, for bug reports
        import traceback

        traceback.print_exception(exc)
    msg = " ".join(str(exc).split()) or type(exc).__name__
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(1) from None


@app.command()
def version() -> None:
    """Print the rotvid version."""
    typer.echo(__version__)


@app.command()
def backends() -> None:
    """Show which attention backends run on this machine, and why not where they don't."""
    from rotvid.kernels.dispatch import describe_backends
    from rotvid.kernels.recipes import int4
    from rotvid.kernels.recipes.auto import auto_recipe

    for name, reason in describe_backends().items():
        typer.echo(f"{name:10s} {reason}")
    recipe, why = auto_recipe()
    typer.echo(f"{'recipe':10s} auto -> {recipe} ({why}); --recipe {int4.RECIPE.name} keeps the paper's INT4 everywhere")
    from rotvid.kernels.cuda_toolkit import describe_compiler

    typer.echo(f"{'compiler':10s} {describe_compiler()}")


@app.command()
def build(
    arch: Annotated[Optional[str], typer.Option("--arch", help="Build for this GPU architecture (sm80, sm86, sm87, "
                                                "sm89, sm90a) instead of this machine's GPU; needs torch's CUDA "
                                                "build.")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="Parallel compile jobs (default: $MAX_JOBS, "
                                                "else every core).")] = None,
) -> None:
    """Compile the CUDA kernels for this machine's GPU ahead of time, into the extension cache."""
    with _user_errors():
        import os

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
            TimeElapsedColumn

        from rotvid.kernels import cuda_build

        _check_positive("--jobs", jobs)
        if jobs is not None:
            os.environ["MAX_JOBS"] = str(jobs)
        cap = cuda_build.parse_arch(arch) if arch is not None else None
        try:
            plan = cuda_build.plan_build(cap)  # no GPU, a CPU torch, no compiler or one that does not fit: here
            typer.echo(f"compiler: {plan.toolkit.describe()}")
            console = Console(stderr=True)
            verb = "loading" if plan.built else "building"
            console.print(f"{verb} {plan.name} into {plan.folder}", markup=False, highlight=False, soft_wrap=True)
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("objects"), TimeElapsedColumn(), console=console, transient=False) as bar:
                task = bar.add_task(f"{verb} the {plan.arch} kernels", total=None)
                seconds = cuda_build.build_extension(
                    plan, on_progress=lambda done, total: bar.update(task, completed=done, total=total))
        except RuntimeError as exc:  # also a failed compile: its log is above
            _fail(exc)
        if seconds is None:
            last = cuda_build.last_build()
            took = f"; the last build took {last['seconds']:.0f} s" if last and "seconds" in last else ""
            typer.echo(f"up to date: {plan.name} ({plan.arch}) in {plan.folder}{took}")
        else:
            typer.echo(f"built {plan.name} ({plan.arch}) in {seconds:.0f} s into {plan.folder} (recorded in "
                       f"{plan.folder / 'build.json'})")


# ---- shared option helpers --------------------------------------------------------------------


def _prompts(prompt: str | None, prompt_file: Path | None) -> list[str]:
    from rotvid.eval.generation import load_prompts

    if prompt is not None and prompt_file is not None:
        raise ValueError("--prompt and --prompt-file: pass one of them, not both")
    if prompt_file is not None:
        return load_prompts(prompt_file)
    if prompt is None:
        raise ValueError("--prompt: expected a prompt (or --prompt-file with one prompt per line)")
    if not prompt.strip():
        raise ValueError("--prompt: expected a non-empty prompt")
    return [prompt]


def _check_dtype_device(dtype: str, device: str) -> None:
    import torch

    from rotvid.pipelines.loading import DTYPES

    if dtype.lower() not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if device != "auto":
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ValueError(f"--device: expected auto, cpu, cuda or cuda:N, got {device!r}") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA GPU on this machine (torch.cuda.is_available() is False)")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                             f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")


def _check_model(model: str) -> None:
    """Fail fast (before any loading) on a name that is neither a folder, a hub id nor a known model."""
    from rotvid.pipelines.loading import resolve_model

    resolve_model(model)


def _check_positive(name: str, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name}: expected a positive number, got {value}")


def _request_template(*, seed, negative_prompt, image, height, width, frames, steps, guidance_scale,
                      max_sequence_length, fps):
    from rotvid.eval.generation import GenerationRequest

    for name, value in (("--height", height), ("--width", width), ("--frames", frames), ("--steps", steps),
                        ("--max-sequence-length", max_sequence_length), ("--fps", fps)):
        _check_positive(name, value)
    if image is not None:
        from rotvid.request_checks import check_image

        check_image(image)
    return GenerationRequest(
        prompt="", seed=seed, negative_prompt=negative_prompt, image=str(image) if image is not None else None,
        height=height, width=width, frames=frames, steps=steps, guidance_scale=guidance_scale,
        max_sequence_length=max_sequence_length, fps=fps,
    )


def _check_request_before_loading(model: str, template, device: str | None = None, dtype: str = "bf16") -> None:
    """What the pipeline's config files can tell (--image, --height/--width multiples, the frame rule, the model's
    limits and the memory the size needs on ``device``), checked before any weight loads (a 14B model takes minutes
    to load)."""
    from rotvid.eval.generation import check_request
    from rotvid.pipelines.loading import DTYPES
    from rotvid.pipelines.pipeline_config import read_pipeline_config
    from rotvid.request_checks import check_size_fits

    config = read_pipeline_config(model)
    check_request(config, template)
    check_size_fits(config, template, _run_device(device) if device is not None else None,
                    dtype_bytes=DTYPES[dtype.lower()].itemsize)


def _schedule(value: str | None, steps: int | None = None):
    """A preset name or a JSON file (a Schedule, or a RotvidConfig whose schedule is taken)."""
    import json

    from rotvid.pipelines.schedule import SCHEDULE_PRESETS, Schedule, schedule_preset

    if value is None:
        return None
    if value in SCHEDULE_PRESETS:
        return schedule_preset(value)
    p = Path(value)
    if not p.is_file():
        raise ValueError(f"--schedule: {value!r} is neither a preset ({', '.join(SCHEDULE_PRESETS)}) nor a file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--schedule {p}: not valid JSON ({exc})") from None
    calibrated = None
    if isinstance(data, dict) and "version" in data and "schedule" in data:
        calibrated = (data.get("accuracy") or {}).get("num_steps")  # files written before Schedule.num_steps
        data = data["schedule"]
    schedule = Schedule.from_dict(data)
    if schedule.num_steps is None and isinstance(calibrated, int) and calibrated > 0:
        schedule = replace(schedule, num_steps=calibrated)
    from rotvid.request_checks import steps_of_schedule

    steps_of_schedule(schedule, steps, f"--schedule {p}")
    return schedule


def _dense_rules(dense_first_steps: int | None, dense_blocks: str | None) -> dict:
    """The schedule's sparsity rules given on the command line (``{}`` for none)."""
    rules: dict = {}
    if dense_first_steps is not None:
        if dense_first_steps < 0:
            raise ValueError(f"--dense-first-steps: expected a count >= 0, got {dense_first_steps}")
        rules["dense_first_steps"] = dense_first_steps
    if dense_blocks is not None:
        try:
            rules["dense_blocks"] = tuple(int(x) for x in dense_blocks.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--dense-blocks: expected comma-separated block indices, got {dense_blocks!r}") from None
    return rules


def _dense_flags(dense: dict) -> str:
    """The options that gave the sparsity rules ``dense`` (from :func:`_dense_rules`), e.g. ``--dense-blocks``."""
    return ", ".join("--" + k.replace("_", "-") for k in dense)


def _check_dense_has_block_map(dense: dict, has_block_map: bool) -> None:
    """The sparsity rules ``dense`` act on a block map: a ValueError when some are given and the run has no map."""
    if dense and not has_block_map:
        raise ValueError(f"{_dense_flags(dense)}: sparsity rules without a block map (pass --sparsity radial or "
                         "topp:TAU)")


def _base_config(config_file: Path | None):
    from rotvid.pipelines.config import RotvidConfig

    if config_file is None:
        return None
    if not config_file.is_file():
        raise FileNotFoundError(f"--config {config_file} does not exist")
    return RotvidConfig.from_json(config_file)


def _run_device(device: str):
    """The torch device of --device (``auto``: cuda when available)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _load(model: str, dtype: str, device: str, worker=None):
    """Load the pipeline; in a --gpus worker, on its device and under context parallelism."""
    import torch

    from rotvid.pipelines.loading import load_pipeline

    if worker is not None:
        device = worker.device  # "cuda": the worker's GPU is the current device
    elif device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    _quiet_library_bars()
    pipe = load_pipeline(model, dtype=dtype, device=device)
    pipe.set_progress_bar_config(disable=True)  # rotvid's own bar counts the steps
    if worker is not None:
        from rotvid.distributed_run import parallelize_pipeline

        parallelize_pipeline(pipe, worker.world_size)
    return pipe


def _note_if_cpu(bar, pipe) -> None:
    """Say once, before the long work, that a CPU run uses the slow PyTorch reference."""
    from rotvid.eval.generation import _pipeline_device

    if _pipeline_device(pipe).type == "cpu":
        bar.log("note: running on the CPU: quantized attention uses the PyTorch reference backend "
                "(exact, slow); a full-size model takes hours here. Use a CUDA GPU for real runs.")


def _quiet_library_bars() -> None:
    """diffusers/transformers loading bars would interleave with rotvid's progress bar."""
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    dlog.disable_progress_bar()
    tlog.disable_progress_bar()


class _Progress:
    """A rich progress bar over denoising steps (stderr), or nothing with --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.progress = None
        self.task = None
        self.console = None

    def __enter__(self):
        if not self.quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.console = Console(stderr=True)
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
            )
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)
        return False

    def log(self, text: str) -> None:
        if self.console is not None:  # (soft_wrap: a path in the line is never broken across lines)
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def start(self, description: str) -> None:
        if self.progress is not None:
            self.task = self.progress.add_task(description, total=None)

    def step(self, done: int, total: int) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=done, total=total)


# ---- generate ---------------------------------------------------------------------------------

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Friendly name (wan2.1-t2v-1.3b, wan2.2-t2v-a14b, "
                                       "hunyuanvideo-t2v, cogvideox-5b, ...), hub id, or local pipeline folder.")]
SeedOpt = Annotated[int, typer.Option(help="Seed of the initial noise (CPU generator: same noise on any device).")]
HeightOpt = Annotated[Optional[int], typer.Option(help="Height in pixels (default: the pipeline's, Wan: 480).")]
WidthOpt = Annotated[Optional[int], typer.Option(help="Width in pixels (default: the pipeline's, Wan: 832).")]
FramesOpt = Annotated[Optional[int], typer.Option(help="Number of frames (default: the pipeline's, Wan: 81).")]
StepsOpt = Annotated[Optional[int], typer.Option(help="Denoising steps (default: the pipeline's, Wan: 50).")]
GuidanceOpt = Annotated[Optional[float], typer.Option("--guidance-scale", help="CFG scale (default: the pipeline's).")]
NegOpt = Annotated[Optional[str], typer.Option("--negative-prompt", help="Negative prompt.")]
ImageOpt = Annotated[Optional[Path], typer.Option("--image", help="Conditioning image (image-to-video models).")]
MaxSeqOpt = Annotated[Optional[int], typer.Option("--max-sequence-length",
                                                  help="Text tokens (default: the pipeline's).")]
FpsOpt = Annotated[Optional[float], typer.Option(help="Frame rate of the mp4 (default: the model's: Wan 16, "
                                                 "HunyuanVideo 24, CogVideoX 8).")]
DtypeOpt = Annotated[str, typer.Option(help="Model dtype: bf16, fp16 or fp32.")]
DeviceOpt = Annotated[str, typer.Option(help="cuda, cpu, or auto (cuda when available).")]
ScheduleOpt = Annotated[Optional[str], typer.Option(help="FP16-fallback schedule: a preset (none, paper-wan2.2-t2v, "
                                                    "paper-wan2.2-i2v, paper-hunyuan-t2v) or a JSON file "
                                                    "(default: the paper's for the model's family).")]
BackendOpt = Annotated[Optional[str], typer.Option(help="Attention backend: auto, reference or cuda (default: auto).")]
SmoothKOpt = Annotated[Optional[bool], typer.Option("--smooth-k/--no-smooth-k", show_default=False,
                                                    help="Subtract the mean key before quantizing (default: on).")]
SmoothQOpt = Annotated[Optional[bool], typer.Option("--smooth-q/--no-smooth-q", show_default=False,
                                                    help="Subtract the per-head query mean, with the ΔS score "
                                                    "correction (default: the recipe's: on for int4 / int4-sym-p / "
                                                    "int4-fp8, off for int8-fp8, whose kernels do not smooth Q).")]
SmoothVOpt = Annotated[Optional[bool], typer.Option("--smooth-v/--no-smooth-v", show_default=False,
                                                    help="Subtract the mean value, added back to the output "
                                                    "(default: the recipe's: on for int4 / int4-sym-p, off for "
                                                    "the FP8-V recipes int8-fp8 / int4-fp8).")]
SparsityOpt = Annotated[Optional[str], typer.Option("--sparsity", help="Block map of the quantized calls: none "
                                                    "(every key block; the default), radial[:band=INT,window=INT,"
                                                    "decay=FLOAT] (static, from the token grid), or topp:TAU[,sim="
                                                    "FLOAT] (per call, from Q and K). Only calls the schedule "
                                                    "quantizes get a map.")]
DenseFirstStepsOpt = Annotated[Optional[int], typer.Option("--dense-first-steps", help="With a block map: the first N "
                                                           "denoising steps run dense (no map).")]
DenseBlocksOpt = Annotated[Optional[str], typer.Option("--dense-blocks", help="With a block map: comma-separated "
                                                       "blocks (global index, negative from the end) that run dense, "
                                                       "e.g. 0,1,-1.")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace existing outputs.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary (for scripts).")]
GpusOpt = Annotated[int, typer.Option("--gpus", help="Processes to spread each forward over (context parallelism, "
                                      "Wan: Ulysses over as many as divide the heads, ring attention over the rest): "
                                      "one GPU each over NCCL, or CPU processes over gloo with --device cpu. Launches "
                                      "torchrun; rank 0 writes the outputs.")]


def _cli_args_of_this_command(ctx: typer.Context) -> list[str]:
    """The current command's arguments, rebuilt from the parsed values (for the torchrun workers)."""
    args = ["--verbose"] if _STATE["verbose"] else []
    args.append(ctx.info_name)
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None:
            continue
        if param.param_type_name == "argument":
            args.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        elif getattr(param, "is_flag", False):
            if value:
                args.append(param.opts[0])
            elif getattr(param, "secondary_opts", None):  # --x/--no-x given as False: pass --no-x on
                args.append(param.secondary_opts[0])
        else:
            args.extend([param.opts[0], str(value)])
    return args


def _launch_workers(ctx: typer.Context, gpus: int, device: str) -> bool:
    """With --gpus N > 1 in the launching process: run this command on N torchrun workers (True)."""
    from rotvid.distributed_run import check_gpus, in_launched_worker, launch

    check_gpus(gpus, device)
    if gpus == 1 or in_launched_worker():
        return False
    rc = launch(gpus, _cli_args_of_this_command(ctx))
    if rc != 0:
        typer.echo(f"Error: --gpus {gpus}: the worker processes failed (torchrun exit code {rc}; their messages "
                   "are above)", err=True)
        raise typer.Exit(1)
    return True


def _join_workers(gpus: int, device: str):
    """Inside a torchrun worker: join the process group (WorkerInfo); single process: None."""
    from rotvid.distributed_run import init_worker

    if gpus == 1:
        return None
    import atexit

    from rotvid.distributed_run import shutdown_worker

    worker = init_worker(gpus, device)
    atexit.register(shutdown_worker)
    return worker
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the transformer(s) (fullgraph; the first "
                                          "step of each video compiles, about two graphs per run).")]


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
    with _user_errors():
        from rotvid.eval.generation import (
            call_kwargs, check_outputs, finished, generate_video, read_sidecar, request_record, video_name,
        )
        from rotvid.request_checks import (
            check_backend_device, check_output_file, check_output_folder, steps_of_schedule,
        )

        prompts = _prompts(prompt, prompt_file)
        _check_model(model)
        _check_dtype_device(dtype, device)
        template = _request_template(seed=seed, negative_prompt=negative_prompt, image=image, height=height,
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
        factory = _ConfigFactory(model, base=_base_config(config), recipe=recipe, rotation=rotation,
                                 schedule=_schedule(schedule, steps), backend=backend,
                                 smoothing=dict(smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v),
                                 sparsity=sparsity, dense=_dense_rules(dense_first_steps, dense_blocks))
        cfg = factory.check()
        if cfg is not None:
            check_backend_device(cfg.backend, device, "--backend" if backend is not None else f"--config {config}: backend")
            template = replace(template, steps=steps_of_schedule(
                cfg.schedule, steps, f"--schedule {schedule}" if schedule is not None else f"--config {config}"))
        _check_request_before_loading(model, replace(template, prompt=prompts[0]), device, dtype)
        if resuming:  # a finished video of another request: refused now, not after loading
            _check_resume(factory, model, template, prompts, outputs)
        if _launch_workers(ctx, gpus, device):
            return
        worker = _join_workers(gpus, device)
        quiet = quiet or (worker is not None and worker.rank != 0)  # progress from rank 0 only

        with _Progress(quiet) as bar:
            bar.log(f"loading {model} ...")
            pipe = _load(model, dtype, device, worker)
            _note_if_cpu(bar, pipe)
            call_kwargs(pipe, replace(template, prompt=prompts[0]))  # --image vs the pipeline, before any work
            if cfg is not None:
                cfg = factory.build(pipe=pipe)
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
                    from rotvid.eval.generation import nothing_quantized_reason

                    t = side["timing"]
                    bar.log(f"wrote {o} ({side['frames']} frames {side['width']}x{side['height']}, "
                            f"{t['total_seconds']:.1f} s, {side['recipe']} calls {100 * side['quantized_fraction']:.0f}%, "
                            f"fallback calls {sum(side['fallbacks'].values())})")
                    why = nothing_quantized_reason(side["run_report"], _schedule_name(cfg))
                    if why is not None:
                        bar.log(f"note: {why}")
        _finish_workers(worker)


def _check_resume(factory, model, template, prompts, outputs) -> None:
    """``generate --prompt-file`` resuming: every finished video must come from this run's request (the
    differences named), checked before loading where the config can be told without the pipeline."""
    from rotvid.eval.generation import finished, request_record

    try:
        cfg = factory.build()
    except _NeedsPipeline:  # a hub id the model table does not know: checked once loaded
        return
    for p, o in zip(prompts, outputs):
        if o.exists():
            finished(o, request_record(model, replace(template, prompt=p), cfg.to_dict() if cfg is not None else None))


def _finish_workers(worker) -> None:
    """A multi-process run's normal end: every rank leaves together (distributed_run.finish_worker)."""
    if worker is not None:
        from rotvid.distributed_run import finish_worker

        finish_worker()


def _schedule_name(cfg) -> str | None:
    schedule = getattr(cfg, "schedule", None)
    return getattr(schedule, "name", None) if schedule is not None and not isinstance(schedule, str) else schedule


def _check_learned_file(flag: str, rotation: str) -> None:
    """A ``learned:FILE`` rotation names an existing file (``flag``: the option it came from)."""
    if rotation.startswith("learned:") and not Path(rotation[len("learned:"):]).is_file():
        raise ValueError(f"{flag}{'' if flag.endswith(':') else ' '}{rotation}: the learned-rotation file does not "
                         "exist (rotvid calibrate writes it)")


def _check_backend(backend: str | None) -> None:
    from rotvid.pipelines.config import BACKENDS

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"--backend: expected {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, got {backend!r}")


def _runs_model_attention(recipe: str | None) -> bool:
    """True for a registered recipe that runs the model's own attention (``fp16``: nothing quantized)."""
    from rotvid.kernels.recipes import recipes

    return any(r.name == recipe and not r.quantized for r in recipes())


class _ConfigFactory:
    """Builds the RotvidConfig of a run from --config, --recipe, --rotation, --schedule, --backend,
    --smooth-k/q/v (``smoothing``: ``{"smooth_k": bool or None, ...}``, None = not given), --sparsity and the
    schedule's sparsity rules --dense-first-steps / --dense-blocks (``dense``: the given ones, applied to whichever
    schedule the run gets).

    ``--recipe fp16`` without ``--rotation`` and without ``--config`` means the untouched pipeline
    (the FP16 reference): :meth:`check` and :meth:`build` return None. Without ``--schedule`` or
    ``--config`` the schedule is the paper's for the model's family.
    """

    def __init__(self, model, *, base=None, recipe=None, rotation=None, schedule=None, backend=None, smoothing=None,
                 sparsity=None, dense=None):
        self.model, self.base, self.schedule = model, base, schedule
        self.changes = {k: v for k, v in (("recipe", recipe), ("rotation", rotation), ("backend", backend),
                                          ("sparsity", sparsity), *(smoothing or {}).items())
                        if v is not None}
        self.dense = dict(dense or {})
        self.untouched = base is None and _runs_model_attention(recipe) and rotation is None
        if sparsity is not None and _runs_model_attention(recipe):
            from rotvid.kernels.sparsity import parse_sparsity

            if parse_sparsity(sparsity).enabled:
                raise ValueError(f"--sparsity {sparsity}: --recipe {recipe} runs the model's own attention, which "
                                 "takes no block map (a map applies to quantized calls only)")
        if rotation is not None:
            _check_learned_file("--rotation", rotation)

    def _with_dense(self, cfg, *, strict: bool = True):
        """``cfg`` with the --dense-* rules on its schedule when it has a block map; without one, a ValueError
        (``strict``: a single run) or ``cfg`` as it is (an eval's dense variants)."""
        if not self.dense:
            return cfg
        has_block_map = cfg.sparsity.enabled or bool(cfg.schedule.block_sparsity)
        if not strict and not has_block_map:
            return cfg
        _check_dense_has_block_map(self.dense, has_block_map)
        return cfg.with_(schedule=replace(cfg.schedule, **self.dense))

    def check(self):
        """Validate without loading anything (default schedule); None for the untouched pipeline."""
        from rotvid.pipelines.config import RotvidConfig

        if self.untouched:
            return None
        cfg = (self.base or RotvidConfig()).with_(**self.changes)
        return self._with_dense(cfg if self.schedule is None else cfg.with_(schedule=self.schedule))

    def check_variant(self, recipe, rotation, sparsity):
        """Validate one eval variant's config without loading anything (default schedule)."""
        from rotvid.pipelines.config import RotvidConfig

        cfg = (self.base or RotvidConfig()).with_(**{**self.changes, "recipe": recipe, "rotation": rotation,
                                                      "sparsity": sparsity})
        return self._with_dense(cfg, strict=False)

    def build(self, pipe=None, **overrides):
        """The config; ``overrides`` (recipe, rotation) win over the options. ValueError when the
        family's schedule is needed, cannot be told without loading, and ``pipe`` is None."""
        from rotvid.eval.generation import default_schedule
        from rotvid.pipelines.config import RotvidConfig
        from rotvid.pipelines.schedule import schedule_preset

        if self.untouched and not overrides:
            return None
        changes = {**self.changes, **overrides}
        if self.schedule is None and self.base is None:
            name = default_schedule(self.model, pipe)
            if name is None:
                raise _NeedsPipeline("--schedule: the model's family is needed to choose the paper schedule")
            self.schedule = schedule_preset(name)
        if self.schedule is not None:
            changes["schedule"] = self.schedule
        return self._with_dense((self.base or RotvidConfig()).with_(**changes), strict="sparsity" not in overrides)


class _NeedsPipeline(ValueError):
    pass


# ---- eval -------------------------------------------------------------------------------------


class _EvalEvents:
    def __init__(self, bar: _Progress, compiling: bool = False):
        self.bar = bar
        self.compiling = compiling

    def loading(self, model: str) -> None:
        self.bar.log(f"loading {model} ...")

    def video_started(self, label: str, name: str, index: int, total: int) -> None:
        self.bar.start(f"[{index + 1}/{total}] {label}/{name[:28]}")
        if self.compiling:
            from rotvid.pipelines.compiling import COMPILE_MESSAGE

            self.bar.log(COMPILE_MESSAGE)

    def step(self, done: int, total: int) -> None:
        self.bar.step(done, total)

    def video_done(self, path: Path, skipped: bool) -> None:
        if skipped:
            self.bar.log(f"kept {path} (already generated)")
            self.bar.step(1, 1)

    def measuring(self, label: str, name: str) -> None:
        self.bar.log(f"measuring {label}/{name}")

    def vbench(self, line: str) -> None:
        self.bar.log(line)


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
    with _user_errors():
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
            if _launch_workers(ctx, gpus, device):
                return
            worker = _join_workers(gpus, device)
            quiet = quiet or worker.rank != 0  # progress and the summary from rank 0 only
        with _Progress(quiet) as bar:
            if generating:
                report, written = _eval_generated(
                    worker, bar, prompt_file=prompt_file, variants=variants, model=model, image=image, schedule=schedule,
                    backend=backend, smoothing=dict(smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v),
                    steps=steps, height=height, width=width, frames=frames,
                    guidance_scale=guidance_scale, negative_prompt=negative_prompt,
                    max_sequence_length=max_sequence_length, seed=seed, fps=fps, dtype=dtype, device=device,
                    out=out, vbench=vb, samples=samples, overwrite=overwrite, compile=compile, sparsity=sparsity,
                    dense=_dense_rules(dense_first_steps, dense_blocks))
            else:
                _refuse_generation_options(ctx)
                if not candidates:
                    raise ValueError("CANDIDATE: expected at least one candidate video or folder after REFERENCE")
                events = _EvalEvents(bar)
                report, written = evaluate_paths(reference, candidates, out, overwrite=overwrite, vbench=vb,
                                                 samples=samples, on_video=events.measuring, on_vbench=events.vbench)
        if not quiet and report is not None:
            typer.echo(summary_table(report))
            typer.echo(f"report: {written['markdown']}")
        _finish_workers(worker)


# eval's options that only the generating form (--prompt-file / --variants) uses
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
    _check_backend(backend)
    from rotvid.eval.generation import load_prompts
    from rotvid.kernels.sparsity import parse_sparsity

    prompts = load_prompts(prompt_file)
    specs = parse_variants(variants, default_sparsity=parse_sparsity(sparsity) if sparsity is not None else None)
    for spec in specs:  # before any video is generated
        _check_learned_file(f"--variants {spec.recipe}:", spec.rotation)
    _check_model(model)
    _check_dtype_device(dtype, device)
    specs, notes = resolve_auto_variants(specs, _run_device(device))
    for note in notes:
        bar.log(note)
    template = _request_template(seed=seed, negative_prompt=negative_prompt, image=image, height=height, width=width,
                                 frames=frames, steps=steps, guidance_scale=guidance_scale,
                                 max_sequence_length=max_sequence_length, fps=fps)
    from rotvid.request_checks import check_backend_device, steps_of_schedule

    check_backend_device(backend, device)
    factory = _ConfigFactory(model, schedule=_schedule(schedule, steps), backend=backend, smoothing=smoothing,
                             dense=dense)
    template = replace(template, steps=steps_of_schedule(factory.schedule, steps, f"--schedule {schedule}"))
    for spec in specs:  # every variant's config, before any video is generated
        factory.check_variant(spec.recipe, spec.rotation, spec.sparsity)
    if dense and not any(spec.sparsity.enabled for spec in specs):
        raise ValueError(f"{_dense_flags(dense)}: sparsity rules, but no variant has a block map (add :SPARSITY to a "
                         "variant, e.g. int8-fp8:half:topp0.9, or pass --sparsity)")
    _check_request_before_loading(model, replace(template, prompt=prompts[0]), device, dtype)
    state: dict = {}

    def load():
        if "pipe" not in state:
            state["pipe"] = _load(model, dtype, device, worker)
        return state["pipe"]

    def make_config(spec):
        try:
            return factory.build(recipe=spec.recipe, rotation=spec.rotation, sparsity=spec.sparsity)
        except _NeedsPipeline:
            return factory.build(pipe=load(), recipe=spec.recipe, rotation=spec.rotation, sparsity=spec.sparsity)

    return evaluate_generated(prompts, specs, out, template, model=model, load=load, make_config=make_config,
                              overwrite=overwrite, vbench=vbench, samples=samples,
                              events=_EvalEvents(bar, compiling=compile), compile=compile)


# ---- VBench environment -----------------------------------------------------------------------


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
                                                          "does).")] = None,
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
    dense_first_steps: DenseFirstStepsOpt = None,
    dense_blocks: DenseBlocksOpt = None,
) -> None:
    """Learn per-block rotations and an adaptive FP16 schedule from a few prompts.

    Use the result with: rotvid generate --rotation learned:OUT/rotations.safetensors
    --schedule OUT/schedule.json (same --steps as here).
    """
    with _user_errors():
        from rotvid.eval.generation import call_kwargs, load_prompts
        from rotvid.pipelines.calibrate import CalibrationOptions, calibrate as run_calibration
        from rotvid.kernels.recipes import AUTO, quantized_recipe_names
        from rotvid.kernels.sparsity import parse_sparsity

        if not prompt_file.is_file():
            raise FileNotFoundError(f"--prompt-file {prompt_file} does not exist")
        prompts = load_prompts(prompt_file)
        _check_model(model)
        _check_dtype_device(dtype, device)
        if pairing not in ("half", "interleaved"):
            raise ValueError(f"--pairing: expected half or interleaved, got {pairing!r}")
        if objective not in ("scores", "output"):
            raise ValueError(f"--objective: expected scores or output, got {objective!r}")
        if recipe != AUTO and recipe not in quantized_recipe_names():
            raise ValueError(f"--recipe: expected auto or a quantized recipe ({', '.join((AUTO, *quantized_recipe_names()))}), got {recipe!r}")
        _check_positive("--iters", iters)
        _check_positive("--lr", lr)
        _check_positive("--max-tokens", max_tokens)
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
        _check_backend(backend)
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
        template = _request_template(seed=seed, negative_prompt=negative_prompt, image=image, height=height,
                                     width=width, frames=frames, steps=steps, guidance_scale=guidance_scale,
                                     max_sequence_length=max_sequence_length, fps=None)
        _check_request_before_loading(model, replace(template, prompt=prompts[0]), device, dtype)
        steps_set = None
        if capture_steps is not None:
            try:
                steps_set = {int(x) for x in capture_steps.split(",") if x.strip()}
            except ValueError:
                raise ValueError(f"--capture-steps: expected comma-separated step numbers, got {capture_steps!r}") from None
            if not steps_set or min(steps_set) < 0:
                raise ValueError(f"--capture-steps: expected non-negative step numbers, got {capture_steps!r}")
        dense = _dense_rules(dense_first_steps, dense_blocks)
        spec = parse_sparsity(sparsity if sparsity is not None else "none")
        _check_dense_has_block_map(dense, spec.enabled)
        if spec.enabled and unconstrained:
            raise ValueError("--sparsity: the unconstrained rotation is not installable, so no schedule is probed "
                             "(drop --unconstrained or --sparsity)")
        options = CalibrationOptions(
            capture_steps=steps_set, dump_dir=dump_dir, model_name=model,
            pairing=pairing, per_head=per_head, iters=iters, lr=lr, objective=objective, unconstrained=unconstrained,
            max_tokens=max_tokens, recipe=recipe, backend=backend or "auto", cosine_floor=cosine_floor,
            target_quantized_fraction=target_quantized, seed=seed, sparsity=spec, **dense,
        )
        with _Progress(quiet) as bar:
            bar.log(f"loading {model} ...")
            pipe = _load(model, dtype, device)
            _note_if_cpu(bar, pipe)
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


@app.command("vbench-setup")
def vbench_setup(
    venv: Annotated[Optional[Path], typer.Option(help="Where to create the VBench environment "
                                                 "(default: ~/.cache/rotvid/vbench-venv).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands only.")] = False,
) -> None:
    """Create the separate Python environment VBench runs in (vbench pins old transformers/numpy)."""
    with _user_errors():
        from rotvid.eval.vbench_runner import DEFAULT_VENV, setup_commands

        target = (venv or DEFAULT_VENV).expanduser()
        if (target / "bin" / "python").exists() and not dry_run:
            raise FileExistsError(f"{target} already exists; use it with --vbench-python {target / 'bin' / 'python'}")
        for cmd in setup_commands(target):
            typer.echo(" ".join(cmd))
            if not dry_run:
                rc = subprocess.call(cmd)
                if rc != 0:
                    raise ValueError(f"command failed with exit code {rc}: {' '.join(cmd)}")
        if not dry_run:
            py = target / "bin" / "python"
            check = subprocess.run([str(py), "-c", "import vbench.utils"], capture_output=True, text=True)
            if check.returncode != 0:
                last = (check.stderr.strip().splitlines() or ["?"])[-1]
                raise ValueError(f"{target} was made but `import vbench` fails there ({last}); torch and torchvision "
                                 "must be builds of the same release from the same index")
            typer.echo(f"done: pass --vbench-python {py} (or set ROTVID_VBENCH_PYTHON)")


if __name__ == "__main__":  # pragma: no cover
    app()
