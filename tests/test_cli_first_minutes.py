"""A new user's first minutes (issue 32): what the pipeline's config files can tell is checked before any weight
loads and names the option; an unreachable hub says what to do; no sidecar without its video; a run that
quantizes nothing says why."""

import json
import time

import numpy as np
import pytest

import rotvid.cli.pipeline
import rotvid.pipelines.loading
from rotvid.eval import generation as gen
from rotvid.pipelines.report import nothing_quantized_reason
from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (tiny_wan: a fixture)
from tests.test_cli_i2v import random_image, tiny_i2v  # noqa: F401  (tiny_i2v: a fixture)

# TINY without --frames (the frame rule is what some tests change)
SMALL = [a for i, a in enumerate(TINY) if not (a == "--frames" or (i and TINY[i - 1] == "--frames"))]


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight load fails the test: the checks must come first."""

    def loaded(*args, **kwargs):
        raise AssertionError("weights were loaded before the request was checked")

    monkeypatch.setattr(rotvid.cli.pipeline, "load", loaded)
    monkeypatch.setattr(rotvid.pipelines.loading, "load_pipeline", loaded)
    from diffusers import DiffusionPipeline

    monkeypatch.setattr(DiffusionPipeline, "from_pretrained", loaded)


@pytest.fixture(scope="module")
def tiny_pipe(tiny_wan):
    import torch

    from rotvid.pipelines.loading import load_pipeline

    pipe = load_pipeline(tiny_wan, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- checks from the config files, before any weight loads ------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "eval", "calibrate"])
def test_config_checks_fail_before_weight_loading_and_name_the_option(command, tiny_wan, tmp_path, no_weights):
    (tmp_path / "p.txt").write_text("a dog\n")
    if command == "generate":
        base = ["generate", "-p", "a dog", "--out", tmp_path / "a.mp4"]
    elif command == "eval":
        base = ["eval", "--prompt-file", tmp_path / "p.txt", "--variants", "int4:half", "--out", tmp_path / "ev"]
    else:
        base = ["calibrate", "--prompt-file", tmp_path / "p.txt", "--out", tmp_path / "cal"]
    cases = [
        (["--frames", "6"], ("--frames 6", "4k+1", "--frames 5 or 9")),  # diffusers would silently make 5
        (["--frames", "5", "--height", "70"], ("--height 70", "multiple of 16", "64 or 80")),
        (["--frames", "5", "--width", "8"], ("--width 8", "multiple of 16", "(e.g. 16)")),
        (["--frames", "5", "--image", random_image(tmp_path / "i.png", 0)],
         ("--image", "WanPipeline is a text-to-video pipeline and takes no image")),
    ]
    for extra, fragments in cases:
        t0 = time.perf_counter()
        r = run(*base, "--model", tiny_wan, *SMALL, *extra)
        assert_fails(r, *fragments)
        assert "loading" not in r.stderr
        assert time.perf_counter() - t0 < 30  # one config file read, not a pipeline load
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.png", "p.txt"]  # nothing written


def test_image_to_video_needs_image_before_loading(tiny_i2v, tmp_path, no_weights):
    r = run("generate", "-p", "a dog", "--model", tiny_i2v, *TINY, "--out", tmp_path / "a.mp4")
    assert_fails(r, "--image: WanImageToVideoPipeline is an image-to-video pipeline; pass --image FILE")
    assert "loading" not in r.stderr


def test_pipeline_config_read_without_weights(tiny_wan, tmp_path):
    """The facts come from the JSON files alone: a folder whose weight files are gone still gives them."""
    import shutil

    from rotvid.pipelines.pipeline_config import read_pipeline_config

    folder = tmp_path / "configs-only"
    shutil.copytree(tiny_wan, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    cfg = read_pipeline_config(folder)
    assert (cfg.pipeline_class, cfg.family, cfg.size_multiple, cfg.temporal_factor) == ("WanPipeline", "wan", 16, 4)
    assert not cfg.takes_image and "num_frames" in cfg.call_parameters
    # a VAE with another spatial factor and a transformer patch of 4: the multiple follows (lcm(16, 8 * 4))
    t = json.loads((folder / "transformer" / "config.json").read_text())
    t["patch_size"] = [1, 4, 4]
    (folder / "transformer" / "config.json").write_text(json.dumps(t))
    assert read_pipeline_config(folder).size_multiple == 32


def test_cogvideox_1_5_latent_frames_rule(tmp_path):
    """CogVideoX 1.5 (patch_size_t 2) pads an odd latent frame count: refused up front, with the counts that work."""
    from rotvid.eval.generation import GenerationRequest, check_request
    from rotvid.pipelines.pipeline_config import PipelineConfig

    cfg = PipelineConfig(source="x", pipeline_class="CogVideoXPipeline", family="cogvideox",
                         call_parameters=("prompt", "height", "width", "num_frames"), size_multiple=16,
                         temporal_factor=4, latent_frames_multiple=2)
    check_request(cfg, GenerationRequest(prompt="a", frames=5))  # 2 latent frames
    with pytest.raises(ValueError, match=r"--frames 9: .* patch_size_t 2 .* pass --frames 5 or 13"):
        check_request(cfg, GenerationRequest(prompt="a", frames=9))  # 3 latent frames
    with pytest.raises(ValueError, match=r"--max-sequence-length: CogVideoXPipeline does not take"):
        check_request(cfg, GenerationRequest(prompt="a", max_sequence_length=8))


# ---- the hub ----------------------------------------------------------------------------------------------------


def test_unreachable_hub_says_what_to_do(tmp_path, monkeypatch, no_weights):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache and outgoing traffic has "
                                      "been disabled. To enable hf.co look-ups and downloads online, set "
                                      "'local_files_only' to False.")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    r = run("generate", "-p", "a dog", "--out", tmp_path / "a.mp4")  # the README's first command
    assert_fails(r, "'wan2.1-t2v-1.3b' (Wan-AI/Wan2.1-T2V-1.3B-Diffusers)", "not in the local cache",
                 "--model FOLDER", "HF_HUB_OFFLINE=1", "HF_HOME")
    assert "local_files_only" not in r.stderr
    assert "--model proxy" in r.stderr  # the bundled model, which needs no network
    # without a bundled model in the model table, the message does not offer one
    from rotvid.pipelines.model_table import MODELS

    monkeypatch.delitem(MODELS, "proxy")
    r = run("generate", "-p", "a dog", "--out", tmp_path / "a.mp4")
    assert_fails(r, "--model FOLDER")
    assert "--model proxy" not in r.stderr


def test_load_pipeline_turns_diffusers_offline_error_into_the_hint(monkeypatch):
    from diffusers import DiffusionPipeline

    from rotvid.pipelines.pipeline_config import HubUnreachableError

    def diffusers_offline(*args, **kwargs):
        raise OSError("Cannot load model Wan-AI/Wan2.1-T2V-1.3B-Diffusers: the model is not fully cached locally "
                      "(...). To enable repo look-ups and downloads online, pass 'local_files_only=False' as input.")

    monkeypatch.setattr(DiffusionPipeline, "from_pretrained", diffusers_offline)
    with pytest.raises(HubUnreachableError, match=r"--model FOLDER.*HF_HUB_OFFLINE=1") as info:
        rotvid.pipelines.loading.load_pipeline("wan2.1-t2v-1.3b")
    assert "local_files_only" not in str(info.value)


# ---- outputs ----------------------------------------------------------------------------------------------------


def test_out_folder_refused_before_generating(tiny_wan, tmp_path, no_weights):
    (tmp_path / "clip.mp4").mkdir()
    for extra in ([], ["--overwrite"]):
        r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--out", tmp_path / "clip.mp4", *extra)
        assert_fails(r, "--out", "clip.mp4", "is a folder")
    assert not (tmp_path / "clip.json").exists()
    # eval: --out a file fails before anything is measured or generated
    from rotvid.eval.video_io import write_video

    write_video(tmp_path / "a.mp4", np.zeros((2, 16, 16, 3), np.uint8), 8)
    (tmp_path / "report.txt").write_text("x")
    assert_fails(run("eval", tmp_path / "a.mp4", tmp_path / "a.mp4", "--out", tmp_path / "report.txt"),
                 "--out", "report.txt", "expected a folder")
    (tmp_path / "p.txt").write_text("a dog\n")
    assert_fails(run("eval", "--prompt-file", tmp_path / "p.txt", "--variants", "int4:half", "--model", tiny_wan,
                     *TINY, "--out", tmp_path / "report.txt"), "--out", "expected a folder")
    assert (tmp_path / "report.txt").read_text() == "x"


def test_video_is_written_before_its_sidecar(tiny_pipe, tiny_wan, tmp_path, monkeypatch):
    pipe = tiny_pipe
    request = gen.GenerationRequest(prompt="a dog", height=32, width=32, frames=5, steps=1, max_sequence_length=16)
    out = tmp_path / "a.mp4"
    seen = {}
    real_write_sidecar = gen.write_sidecar

    def spy(video, data):
        seen["video_existed"] = video.exists() and video.stat().st_size > 0
        seen["partial_files"] = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
        return real_write_sidecar(video, data)

    monkeypatch.setattr(gen, "write_sidecar", spy)
    gen.generate_video(pipe, request, out, model=str(tiny_wan), config=None)
    assert seen == {"video_existed": True, "partial_files": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.mp4"]


def test_failed_video_write_leaves_no_sidecar(tiny_pipe, tiny_wan, tmp_path, monkeypatch):
    pipe = tiny_pipe
    request = gen.GenerationRequest(prompt="a dog", height=32, width=32, frames=5, steps=1, max_sequence_length=16)
    gen.generate_video(pipe, request, tmp_path / "a.mp4", model=str(tiny_wan), config=None)
    old_video = (tmp_path / "a.mp4").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gen, "write_video", disk_full)
    with pytest.raises(OSError, match="No space left"):
        gen.generate_video(pipe, request, tmp_path / "b.mp4", model=str(tiny_wan), config=None)
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "b.mp4").exists()
    # overwriting: the old sidecar goes before the new video is written, so it never describes another video
    with pytest.raises(OSError, match="No space left"):
        gen.generate_video(pipe, request, tmp_path / "a.mp4", model=str(tiny_wan), config=None, overwrite=True)
    assert (tmp_path / "a.mp4").read_bytes() == old_video and not (tmp_path / "a.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]  # no partial files either


# ---- a run that quantizes nothing -------------------------------------------------------------------------------


def test_run_that_quantizes_nothing_says_why(tiny_wan, tmp_path):
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--out", tmp_path / "a.mp4")
    assert r.exit_code == 0, r.output
    said = " ".join(r.stderr.split())  # rich wraps long lines
    assert "int4 calls 0%" in said
    assert ("note: 0 of 8 self-attention calls quantized: the schedule paper-wan2.2-t2v keeps them in FP16 "
            "(schedule: first 2 steps: 8 calls)") in said
    assert "--schedule none" in said and "more --steps" in said
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--schedule", "none", "--out", tmp_path / "b.mp4")
    assert r.exit_code == 0 and "self-attention calls quantized" not in r.stderr  # something was quantized


def test_nothing_quantized_reason_names_the_blocks_rule():
    report = {"total_calls": 24, "quantized_calls": 0, "fallbacks": {},
              "fp16_reasons": {"schedule: first 2 blocks": 12, "schedule: last 2 blocks": 12}}
    why = nothing_quantized_reason(report, "paper-wan2.2-t2v")
    assert why.startswith("0 of 24 self-attention calls quantized: the schedule paper-wan2.2-t2v keeps them in FP16 "
                          "(schedule: first 2 blocks: 12 calls; schedule: last 2 blocks: 12 calls)")
    assert "more blocks than the schedule keeps" in why and "--schedule none" in why
    fell = nothing_quantized_reason({"total_calls": 4, "quantized_calls": 0, "fp16_reasons": {},
                                     "fallbacks": {"mask: not a key-padding mask": 4}})
    assert fell == "0 of 4 self-attention calls quantized: fallbacks to FP16 (mask: not a key-padding mask: 4 calls)"
    assert nothing_quantized_reason({"total_calls": 4, "quantized_calls": 1}) is None
    assert nothing_quantized_reason(None) is None  # the untouched reference asked for nothing
    assert nothing_quantized_reason({"recipe": "fp16", "total_calls": 4, "quantized_calls": 0,
                                     "fp16_reasons": {"recipe fp16": 4}}) is None  # FP16 asked for


def test_sidecar_fraction_is_recipe_neutral_and_old_sidecars_still_read(tiny_wan, tmp_path):
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--recipe", "int8-fp8", "--schedule", "none",
            "--out", tmp_path / "a.mp4")
    assert r.exit_code == 0, r.output
    side = json.loads((tmp_path / "a.json").read_text())
    assert side["recipe"] == "int8-fp8" and side["quantized_fraction"] == 1.0 == side["int4_fraction"]
    assert "int8-fp8 calls 100%" in " ".join(r.stderr.split())
    assert gen.quantized_fraction({"int4_fraction": 0.81}) == 0.81  # a sidecar from before the rename
    assert gen.quantized_fraction({"quantized_fraction": 0.5, "int4_fraction": 0.5}) == 0.5
    assert gen.quantized_fraction({}) is None


def test_no_network_fails_at_once_without_the_hubs_retries(monkeypatch):
    """Not cached and the hub's name does not resolve: the hint comes at once, huggingface_hub's minute of
    retries is not waited for."""
    import socket

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    from rotvid.pipelines.pipeline_config import HubUnreachableError, read_pipeline_config

    calls = []

    def download(repo_id, filename, local_files_only=False, **kwargs):
        calls.append(local_files_only)
        if local_files_only:
            raise LocalEntryNotFoundError("not in the cache")
        raise AssertionError("the network was tried although the hub's name does not resolve")

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(HubUnreachableError, match=r"Hub cannot be reached.*--model FOLDER"):
        read_pipeline_config("wan2.2-t2v-a14b")
    assert calls == [True]
