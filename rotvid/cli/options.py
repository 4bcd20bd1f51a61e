"""The options the commands share (``Annotated`` typer options) and the checks of their values."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer


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
                                                    "decay=FLOAT] (static, from the token grid), topp:TAU[,sim="
                                                    "FLOAT] or pmin:P[,sim=FLOAT] (per call, from Q and K). Only "
                                                    "calls the schedule quantizes get a map.")]
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
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the transformer(s) (fullgraph; the first "
                                          "step of each video compiles, about two graphs per run).")]


def read_prompts(prompt: str | None, prompt_file: Path | None) -> list[str]:
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


def check_dtype_device(dtype: str, device: str) -> None:
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


def check_model(model: str) -> None:
    """Fail fast (before any loading) on a name that is neither a folder, a hub id nor a known model."""
    from rotvid.pipelines.loading import resolve_model

    resolve_model(model)


def check_positive(name: str, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name}: expected a positive number, got {value}")


def parse_schedule(value: str | None, steps: int | None = None):
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


def dense_rules(dense_first_steps: int | None, dense_blocks: str | None) -> dict:
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


def base_config(config_file: Path | None):
    from rotvid.pipelines.config import RotvidConfig

    if config_file is None:
        return None
    if not config_file.is_file():
        raise FileNotFoundError(f"--config {config_file} does not exist")
    return RotvidConfig.from_json(config_file)


def check_backend(backend: str | None) -> None:
    from rotvid.pipelines.config import BACKENDS

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"--backend: expected {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, got {backend!r}")
