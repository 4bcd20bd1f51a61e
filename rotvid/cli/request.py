"""The generation request of the command line, checked (rotvid.request_checks) before any weight loads."""

from __future__ import annotations

from rotvid.cli.options import check_positive
from rotvid.cli.pipeline import run_device


def request_template(*, seed, negative_prompt, image, height, width, frames, steps, guidance_scale,
                      max_sequence_length, fps):
    from rotvid.eval.generation import GenerationRequest

    for name, value in (("--height", height), ("--width", width), ("--frames", frames), ("--steps", steps),
                        ("--max-sequence-length", max_sequence_length), ("--fps", fps)):
        check_positive(name, value)
    if image is not None:
        from rotvid.request_checks import check_image

        check_image(image)
    return GenerationRequest(
        prompt="", seed=seed, negative_prompt=negative_prompt, image=str(image) if image is not None else None,
        height=height, width=width, frames=frames, steps=steps, guidance_scale=guidance_scale,
        max_sequence_length=max_sequence_length, fps=fps,
    )


def check_request_before_loading(model: str, template, device: str | None = None, dtype: str = "bf16") -> None:
    """What the pipeline's config files can tell (--image, --height/--width multiples, the frame rule, the model's
    limits and the memory the size needs on ``device``), checked before any weight loads (a 14B model takes minutes
    to load)."""
    from rotvid.eval.generation import check_request
    from rotvid.pipelines.loading import DTYPES
    from rotvid.pipelines.pipeline_config import read_pipeline_config
    from rotvid.request_checks import check_size_fits

    config = read_pipeline_config(model)
    check_request(config, template)
    check_size_fits(config, template, run_device(device) if device is not None else None,
                    dtype_bytes=DTYPES[dtype.lower()].itemsize)
