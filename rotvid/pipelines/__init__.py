"""rotvid.pipelines: run rotvid inside diffusers' video pipelines (the families of :mod:`rotvid.pipelines.families`).

    from rotvid.pipelines import load_pipeline, apply, remove, RotvidConfig

    pipe = load_pipeline("wan2.2-t2v-a14b", dtype="bf16", device="cuda")
    handle = apply(pipe, RotvidConfig(recipe="int4", rotation="half", schedule="paper-wan2.2-t2v"))
    video = pipe(prompt="...", num_inference_steps=40).frames[0]
    print(handle.report.summary())
    remove(pipe)
"""

from rotvid.pipelines.attach import RotvidHandle, apply, find_transformers, remove
from rotvid.pipelines import config as _config
from rotvid.pipelines.config import CONFIG_VERSION, RotvidConfig
from rotvid.pipelines.loading import load_pipeline, resolve_model
from rotvid.pipelines.model_table import DEFAULT_MODEL, FAMILIES, MODELS
from rotvid.pipelines.report import RunReport
from rotvid.pipelines import schedule as _schedule
from rotvid.pipelines.schedule import Schedule, expected_quantized_fraction, schedule_preset
from rotvid.pipelines.step_tracker import StepTracker, StepUnknownError

__all__ = [
    "apply",
    "remove",
    "RotvidHandle",
    "RotvidConfig",
    "CONFIG_VERSION",
    "PIPELINE_RECIPES",
    "Schedule",
    "SCHEDULE_PRESETS",
    "schedule_preset",
    "expected_quantized_fraction",
    "RunReport",
    "StepTracker",
    "StepUnknownError",
    "load_pipeline",
    "resolve_model",
    "find_transformers",
    "DEFAULT_MODEL",
    "FAMILIES",
    "MODELS",
]


def __getattr__(name: str):
    """``PIPELINE_RECIPES``: the registered recipes, as of now (:data:`rotvid.pipelines.config.PIPELINE_RECIPES`);
    ``SCHEDULE_PRESETS``: the schedule presets, as of now (:func:`rotvid.pipelines.schedule.schedule_presets`)."""
    if name == "PIPELINE_RECIPES":
        return _config.PIPELINE_RECIPES
    if name == "SCHEDULE_PRESETS":
        return _schedule.schedule_presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
