import json

import numpy as np
import pytest
import torch
from PIL import Image

from rotvid.eval import generation as gen
from rotvid.pipelines.pipeline_config import default_schedule


class _I2VStub:
    """Only the call signature of an image-to-video pipeline (what call_kwargs inspects)."""

    def __call__(self, image, prompt=None, negative_prompt=None, height=480, width=832, num_frames=81,
                 num_inference_steps=50, guidance_scale=5.0, generator=None, output_type="np",
                 callback_on_step_end=None, max_sequence_length=512):
        raise NotImplementedError


class _T2VStub:
    def __call__(self, prompt=None, height=480, width=832, num_frames=81, num_inference_steps=50, generator=None,
                 output_type="np", callback_on_step_end=None):
        raise NotImplementedError


def test_call_kwargs_image_to_video(tmp_path):
    img = tmp_path / "first.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(img)
    req = gen.GenerationRequest(prompt="a cat", seed=3, image=str(img), frames=9, steps=4)
    kw = gen.call_kwargs(_I2VStub(), req)
    assert kw["image"].size == (40, 24) and kw["image"].mode == "RGB"
    assert (kw["num_frames"], kw["num_inference_steps"], kw["output_type"]) == (9, 4, "np")
    assert "height" not in kw  # None: the pipeline's default
    # the seeded CPU generator: same numbers as a fresh generator with that seed
    assert torch.equal(torch.randn(5, generator=kw["generator"]), torch.randn(5, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(ValueError, match="image-to-video pipeline; pass --image"):
        gen.call_kwargs(_I2VStub(), gen.GenerationRequest(prompt="a cat"))
    with pytest.raises(ValueError, match="takes no image"):
        gen.call_kwargs(_T2VStub(), req)
    with pytest.raises(ValueError, match="guidance_scale: _T2VStub does not take"):
        gen.call_kwargs(_T2VStub(), gen.GenerationRequest(prompt="x", guidance_scale=3.0))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot be read as an image"):
        gen.call_kwargs(_I2VStub(), gen.GenerationRequest(prompt="x", image=str(bad)))


def test_load_prompts_and_names(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("  A Red cat!  \n\n# skipped\nsecond   prompt\n", encoding="utf-8")
    assert gen.load_prompts(p) == ["A Red cat!", "second   prompt"]
    assert gen.video_name(3, "A Red cat!") == "003-a-red-cat"
    assert gen.video_name(0, "¿¿??") == "000-video"
    assert len(gen.video_name(1, "x" * 200)) == 4 + 48
    p.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="has no prompts"):
        gen.load_prompts(p)
    with pytest.raises(FileNotFoundError):
        gen.load_prompts(tmp_path / "missing.txt")
    p.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="UTF-8"):
        gen.load_prompts(p)


@pytest.mark.parametrize(
    "cls, preset",
    [
        ("WanPipeline", "paper-wan2.2-t2v"),
        ("WanImageToVideoPipeline", "paper-wan2.2-i2v"),
        ("HunyuanVideoPipeline", "paper-hunyuan-t2v"),
        ("CogVideoXPipeline", "none"),
        ("HunyuanVideo15Pipeline", "none"),  # the longest prefix: not HunyuanVideo's preset
        ("SkyReelsV2Pipeline", "none"),
    ],
)
def test_default_schedule_of_a_local_folder(tmp_path, cls, preset):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": cls}))
    assert default_schedule(str(tmp_path)) == preset


def test_default_schedule_of_named_models():
    assert default_schedule(None) == "paper-wan2.2-t2v"  # the default model, Wan2.1-T2V-1.3B
    assert default_schedule("wan2.2-i2v-a14b") == "paper-wan2.2-i2v"
    assert default_schedule("hunyuanvideo-t2v") == "paper-hunyuan-t2v"
    assert default_schedule("cogvideox-5b") == "none"
    assert default_schedule("someone/unknown-model") is None  # needs the loaded pipeline


def test_resume_check(tmp_path):
    from rotvid.eval.sidecar import write_sidecar

    out = tmp_path / "v.mp4"
    record = gen.request_record("m", gen.GenerationRequest(prompt="a", seed=1), None)
    assert not gen.finished(out, record)
    out.write_bytes(b"x")
    with pytest.raises(FileExistsError, match="without a rotvid sidecar"):
        gen.finished(out, record)
    write_sidecar(out, {"request": record})
    assert gen.finished(out, record)
    other = gen.request_record("m", gen.GenerationRequest(prompt="a", seed=2), None)
    with pytest.raises(FileExistsError, match="differs in: seed"):
        gen.finished(out, other)


def test_check_outputs(tmp_path):
    from rotvid.eval.sidecar import write_sidecar

    out = tmp_path / "v.mp4"
    gen.check_outputs(out, overwrite=False)
    write_sidecar(out, {"request": {}})  # an orphan sidecar of an interrupted run: may be replaced
    gen.check_outputs(out, overwrite=False)
    out.with_suffix(".json").write_text('{"mine": 1}')  # somebody else's JSON: kept
    with pytest.raises(FileExistsError, match="not a rotvid sidecar"):
        gen.check_outputs(out, overwrite=False)
    out.write_bytes(b"x")
    with pytest.raises(FileExistsError, match="--overwrite"):
        gen.check_outputs(out, overwrite=False)
    gen.check_outputs(out, overwrite=True)


def test_fps_of_checkpoints_and_families():
    wan = type("WanStub", (), {})()
    req = gen.GenerationRequest(prompt="x")
    assert gen.fps_for(wan, gen.GenerationRequest(prompt="x", fps=12.5)) == 12.5
    with pytest.raises(ValueError, match="--fps"):
        gen.fps_for(wan, gen.GenerationRequest(prompt="x", fps=0))
    assert gen.fps_for(wan, req, "wan2.2-ti2v-5b") == 24.0  # no need to look at the pipeline
