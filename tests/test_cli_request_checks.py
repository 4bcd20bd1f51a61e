"""The first minutes (issue 39): everything the request alone can tell is checked before any model loads, naming the
option and the path; a schedule carries its step count; the proxy's call defaults in the Python API; the report says
why nothing was quantized; rotvid --version; apply/remove leave no trap behind."""

import inspect
import json
import os

import pytest
import torch

import rotvid
import rotvid.request_checks
from rotvid.pipelines.schedule import Schedule
from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (tiny_wan: a fixture)
from tests.test_cli_first_minutes import SMALL, no_weights  # noqa: F401  (no_weights: a fixture)
from tests.test_cli_i2v import random_image, tiny_i2v  # noqa: F401  (tiny_i2v: a fixture)


def _generate(tiny_wan, out, *extra):
    return run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--out", out, *extra)


def _no_loading(r):
    assert "loading" not in r.stderr


# ---- --out ------------------------------------------------------------------------------------------------------


def test_out_that_cannot_be_written_is_refused_before_loading(tiny_wan, tmp_path, no_weights):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "p.txt").write_text("a dog\n")
    cases = [
        (tmp_path / "a-file" / "clip.mp4", "a-file is a file, not a folder"),
        (tmp_path / "a-file" / "deeper" / "clip.mp4", "a-file is a file, not a folder"),
        ("/proc/rotvid-clip.mp4", "cannot write in /proc"),
    ]
    for out, fragment in cases:
        r = _generate(tiny_wan, out)
        assert_fails(r, f"--out {out}", fragment)
        _no_loading(r)
    # a prompt file: --out is a folder
    for out, fragment in ((tmp_path / "a-file" / "videos", "a-file is a file"), ("/proc/rotvid-videos", "/proc")):
        r = run("generate", "--prompt-file", tmp_path / "p.txt", "--model", tiny_wan, *TINY, "--out", out)
        assert_fails(r, f"--out {out}", fragment)
    # eval (both forms) and calibrate
    for out in (tmp_path / "a-file" / "report", "/proc/rotvid-eval"):
        r = run("eval", "--prompt-file", tmp_path / "p.txt", "--variants", "int4:half", "--model", tiny_wan, *TINY,
                "--out", out)
        assert_fails(r, f"--out {out}")
        _no_loading(r)
        assert_fails(run("eval", tmp_path / "x.mp4", tmp_path / "y.mp4", "--out", out), f"--out {out}")
        assert_fails(run("calibrate", "--prompt-file", tmp_path / "p.txt", "--model", tiny_wan, *TINY, "--out", out),
                     f"--out {out}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "p.txt"]  # no probe file left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_folder_refused(tiny_wan, tmp_path, no_weights):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert_fails(_generate(tiny_wan, folder / "clip.mp4"), f"--out {folder / 'clip.mp4'}", "cannot write in")
    finally:
        folder.chmod(0o700)


def test_output_checks_leave_nothing_and_accept_new_folders(tmp_path):
    rotvid.request_checks.check_output_file("--out", tmp_path / "new" / "sub" / "a.mp4")
    rotvid.request_checks.check_output_folder("--out", tmp_path / "new-folder")
    rotvid.request_checks.check_output_folder("--out", tmp_path)
    assert list(tmp_path.iterdir()) == []  # checked, not created


# ---- --image and a resumed request ------------------------------------------------------------------------------


def test_unreadable_image_refused_before_loading(tiny_i2v, tmp_path, no_weights):
    (tmp_path / "not-an-image.png").write_text("hello")
    (tmp_path / "a-folder.png").mkdir()
    for image, fragment in ((tmp_path / "not-an-image.png", "cannot be read as an image"),
                            (tmp_path / "a-folder.png", "is a folder")):
        r = run("generate", "-p", "a dog", "--model", tiny_i2v, *TINY, "--image", image, "--out", tmp_path / "a.mp4")
        assert_fails(r, f"--image {image}", fragment)
        _no_loading(r)


def test_resume_with_a_changed_request_refused_before_loading(tiny_wan, tmp_path, monkeypatch):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a dog\n")
    out = tmp_path / "videos"
    r = run("generate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--schedule", "none", "--out", out)
    assert r.exit_code == 0, r.output

    def loaded(*args, **kwargs):
        raise AssertionError("weights were loaded before the resumed request was checked")

    monkeypatch.setattr(rotvid.cli.pipeline, "load", loaded)
    r = run("generate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--schedule", "none", "--seed", "3",
            "--recipe", "int8-fp8", "--out", out)
    assert_fails(r, "000-a-dog.mp4", "different request", "config", "seed")
    _no_loading(r)


# ---- a schedule's step count ------------------------------------------------------------------------------------


def test_schedule_round_trips_its_step_count():
    s = Schedule(fp16_cells=((0, 1),), num_steps=6)
    assert Schedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert "num_steps" not in Schedule().to_dict()  # the presets' JSON is unchanged
    with pytest.raises(ValueError, match="num_steps"):
        Schedule(num_steps=0)


def test_write_schedule_records_the_calibrated_steps(tmp_path):
    from rotvid.pipelines.adaptive_schedule import AccuracyTable, read_schedule, write_schedule

    write_schedule(Schedule(fp16_cells=((0, 0),)), tmp_path / "s.json", accuracy=AccuracyTable(num_steps=6, num_blocks=2))
    assert read_schedule(tmp_path / "s.json").num_steps == 6


@pytest.mark.parametrize("form", ["schedule", "old-file", "config"])
def test_run_without_steps_takes_the_schedules(form, tiny_wan, tmp_path):
    no_steps = [a for i, a in enumerate(TINY) if not (a == "--steps" or (i and TINY[i - 1] == "--steps"))]
    table = {"fp16_cells": [[0, 1]], "name": "calibrated"}
    if form == "schedule":
        path, option = tmp_path / "s.json", "--schedule"
        path.write_text(json.dumps({**table, "num_steps": 3}))
    elif form == "old-file":  # written by calibrate before schedules carried num_steps
        path, option = tmp_path / "s.json", "--schedule"
        path.write_text(json.dumps({"version": 1, "schedule": table, "accuracy": {"num_steps": 3, "num_blocks": 2}}))
    else:
        path, option = tmp_path / "c.json", "--config"
        rotvid.RotvidConfig(schedule=Schedule(**{**table, "fp16_cells": ((0, 1),)}, num_steps=3)).to_json(path)
    out = tmp_path / "a.mp4"
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *no_steps, option, path, "--out", out)
    assert r.exit_code == 0, r.output
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["steps"] == 3 == side["request"]["steps"]  # not the pipeline's 50 (or the folder's)
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *no_steps, "--steps", "4", option, path,
            "--out", tmp_path / "b.mp4")
    assert_fails(r, f"{option} {path}", "calibrated for 3 steps, but --steps is 4", "--steps 3")
    _no_loading(r)


# ---- sizes, memory and backends ---------------------------------------------------------------------------------


def test_sizes_beyond_the_model_or_the_memory_refused_before_loading(tiny_wan, tmp_path, no_weights, monkeypatch):
    base = ["generate", "-p", "a dog", "--model", tiny_wan, "--dtype", "fp32", "--device", "cpu",
            "--out", tmp_path / "a.mp4"]
    # the tiny Wan's RoPE table holds 32 positions per axis (rope_max_seq_len)
    r = run(*base, "--height", "16384", "--width", "16384", "--frames", "801")
    assert_fails(r, "--frames 801", "201 latent patches along time", "32 positions per axis")
    _no_loading(r)
    assert_fails(run(*base, "--height", "1024", "--width", "32", "--frames", "5"), "--height 1024", "64 latent patches")
    # the text encoder's L x L position bias
    monkeypatch.setattr(rotvid.request_checks, "device_memory", lambda device: (16 * 2 ** 30, "a 16 GiB machine"))
    r = run(*base, "--height", "32", "--width", "32", "--frames", "5", "--max-sequence-length", "100000")
    assert_fails(r, "--max-sequence-length 100000", "needs at least", "position bias", "16.0 GiB of a 16 GiB machine")
    # the decoded video (what a 16384 x 16384 x 801 request needs first, on a model whose RoPE takes it)
    monkeypatch.setattr(rotvid.request_checks, "device_memory", lambda device: (2 ** 20, "a 1 MiB machine"))
    r = run(*base, "--height", "512", "--width", "512", "--frames", "5", "--max-sequence-length", "16")
    assert_fails(r, "--height 512 --width 512 --frames 5", "decoded video", "1 MiB machine")


def test_proxy_size_beyond_memory_names_the_options(no_weights, tmp_path, monkeypatch):
    monkeypatch.setattr(rotvid.request_checks, "device_memory", lambda device: (128 * 2 ** 30, "128 GiB"))
    r = run("generate", "-p", "a dog", "--model", "proxy", "--height", "16384", "--width", "16384", "--frames", "801",
            "--device", "cpu", "--out", tmp_path / "a.mp4")
    assert_fails(r, "--height 16384 --width 16384 --frames 801: needs at least 2403.0 GiB")


def test_out_of_memory_after_loading_is_one_line(tiny_wan, tmp_path, monkeypatch):
    from rotvid.eval import generation

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 80000000000 bytes.")

    monkeypatch.setattr(generation, "generate_video", oom)
    assert_fails(_generate(tiny_wan, tmp_path / "a.mp4"), "out of memory", "can't allocate memory", "--height")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_backend_cuda_without_a_gpu_refused(tiny_wan, tmp_path, no_weights):
    (tmp_path / "p.txt").write_text("a dog\n")
    msg = "--backend cuda: no CUDA GPU on this machine"
    assert_fails(_generate(tiny_wan, tmp_path / "a.mp4", "--backend", "cuda"), msg)
    assert_fails(run("eval", "--prompt-file", tmp_path / "p.txt", "--variants", "int4:half", "--model", tiny_wan,
                     *TINY, "--backend", "cuda", "--out", tmp_path / "ev"), msg)
    assert_fails(run("calibrate", "--prompt-file", tmp_path / "p.txt", "--model", tiny_wan, *TINY, "--backend", "cuda",
                     "--out", tmp_path / "cal"), msg)
    rotvid.RotvidConfig(backend="cuda").to_json(tmp_path / "c.json")
    assert_fails(_generate(tiny_wan, tmp_path / "a.mp4", "--config", tmp_path / "c.json"), "backend cuda: no CUDA GPU")


# ---- the Python API ---------------------------------------------------------------------------------------------


def test_load_pipeline_proxy_takes_its_call_defaults(tmp_path):
    pipe = rotvid.load_pipeline("proxy", dtype="fp32")
    params = inspect.signature(pipe.__call__).parameters
    assert {k: params[k].default for k in ("height", "width", "num_frames", "num_inference_steps")} == \
        {"height": 128, "width": 128, "num_frames": 17, "num_inference_steps": 12}
    assert type(pipe).__name__ == "WanPipeline" and pipe.rotvid_call_defaults["num_frames"] == 17
    from diffusers import WanPipeline

    assert isinstance(pipe, WanPipeline) and inspect.signature(WanPipeline.__call__).parameters["height"].default == 480
    pipe.save_pretrained(tmp_path / "saved")  # the class name diffusers records is the pipeline's own
    assert json.loads((tmp_path / "saved" / "model_index.json").read_text())["_class_name"] == "WanPipeline"


def test_folder_call_defaults_apply_to_a_plain_call(tiny_wan):
    pipe = rotvid.load_pipeline(tiny_wan, dtype="fp32")
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a dog", num_inference_steps=1, output_type="np")  # no size given: the folder's 32x32x5
    assert out.frames[0].shape == (5, 32, 32, 3)
    out = pipe("a dog", None, 48, num_inference_steps=1, output_type="np")  # positional height wins
    assert out.frames[0].shape == (5, 48, 32, 3)


def test_summary_says_why_nothing_was_quantized(tiny_wan):
    pipe = rotvid.load_pipeline(tiny_wan, dtype="fp32")
    pipe.set_progress_bar_config(disable=True)
    handle = rotvid.apply(pipe, rotvid.RotvidConfig(schedule="paper-wan2.2-t2v"))
    pipe(prompt="a dog", num_inference_steps=2, output_type="np")
    summary = handle.report.summary()
    rotvid.remove(pipe)
    assert "note: 0 of 8 self-attention calls quantized: the schedule paper-wan2.2-t2v keeps them in FP16" in summary
    assert 'schedule="none"' in summary and "--schedule" not in summary
    # the blocks rule (the paper's schedule on the 6-block proxy keeps blocks 0, 1, 4, 5): named as such
    from rotvid.pipelines.report import RunReport

    report = RunReport(recipe="int4", backend_requested="auto", schedule="paper-wan2.2-t2v")
    report.record_fp16("transformer/0", "schedule: first 2 blocks", 12)
    report.record_fp16("transformer/5", "schedule: last 2 blocks", 12)
    assert "more blocks than the schedule keeps in FP16 (the paper's keep the first and last two)" in report.summary()


def test_version_option():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == rotvid.__version__


def test_apply_messages_point_to_rotvid_remove(tiny_wan):
    pipe = rotvid.load_pipeline(tiny_wan, dtype="fp32")
    other = rotvid.load_pipeline(tiny_wan, dtype="fp32")
    other.transformer = pipe.transformer  # two pipelines sharing one transformer
    rotvid.apply(pipe)
    try:
        with pytest.raises(ValueError, match=r"already applied; call rotvid\.remove\(pipe\) first"):
            rotvid.apply(pipe)
        with pytest.raises(ValueError, match=r"its transformer already runs rotvid, applied through another pipeline "
                                             r"that shares it; call rotvid\.remove\(\) on that pipeline first"):
            rotvid.apply(other)
    finally:
        rotvid.remove(pipe)
    rotvid.remove(rotvid.apply(other).target)  # once removed, the other pipeline may apply


def test_interrupted_run_ends_the_tracked_run(tiny_wan):
    pipe = rotvid.load_pipeline(tiny_wan, dtype="fp32")
    pipe.set_progress_bar_config(disable=True)
    handle = rotvid.apply(pipe, rotvid.RotvidConfig(schedule="none"))

    def stop_after_first(p, step, timestep, kwargs):
        p._interrupt = True
        return {}

    pipe(prompt="a dog", num_inference_steps=4, output_type="np", callback_on_step_end=stop_after_first)
    assert not handle.tracker.in_run() and handle.tracker.step == handle.tracker.num_steps == 4
    pipe(prompt="a dog", num_inference_steps=2, output_type="np")  # the next run is tracked from its start
    assert handle.tracker.runs == 2 and handle.tracker.step == 2
    rotvid.remove(pipe)


@pytest.mark.parametrize("compile", [False, True])
def test_remove_leaves_no_compiled_call_impl(tiny_wan, compile):
    pipe = rotvid.load_pipeline(tiny_wan, dtype="fp32")
    assert "_compiled_call_impl" not in vars(pipe.transformer)
    rotvid.apply(pipe, compile=compile)
    rotvid.remove(pipe)
    assert "_compiled_call_impl" not in vars(pipe.transformer)
    # the caller's own compile is given back
    pipe.transformer.compile()
    own = vars(pipe.transformer)["_compiled_call_impl"]
    rotvid.apply(pipe, compile=compile)
    rotvid.remove(pipe)
    assert vars(pipe.transformer)["_compiled_call_impl"] is own
