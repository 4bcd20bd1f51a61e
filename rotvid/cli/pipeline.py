"""Loading the pipeline a command runs (on --device, or a --gpus worker's GPU)."""

from __future__ import annotations


def run_device(device: str):
    """The torch device of --device (``auto``: cuda when available)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def load(model: str, dtype: str, device: str, worker=None):
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


def note_if_cpu(bar, pipe) -> None:
    """Say once, before the long work, that a CPU run uses the slow PyTorch reference."""
    from rotvid.pipelines.pipeline_config import pipeline_device

    if pipeline_device(pipe).type == "cpu":
        bar.log("note: running on the CPU: quantized attention uses the PyTorch reference backend "
                "(exact, slow); a full-size model takes hours here. Use a CUDA GPU for real runs.")


def _quiet_library_bars() -> None:
    """diffusers/transformers loading bars would interleave with rotvid's progress bar."""
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    dlog.disable_progress_bar()
    tlog.disable_progress_bar()
