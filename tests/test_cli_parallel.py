"""`rotvid generate --gpus 2` / `rotvid eval --gpus 2` on CPU: torchrun with two gloo processes.

The command runs as a subprocess in its own session, so a hang is killed with all of torchrun's
workers (the whole process group) and fails the test instead of blocking CI.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rotvid.cli import app
from rotvid.eval.video_io import iter_frames

from tests.test_cli import TINY, assert_fails

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 150


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory):
    from rotvid.pipelines.tiny import build_tiny_pipeline

    folder = tmp_path_factory.mktemp("tiny-cp") / "wan"
    build_tiny_pipeline("wan", folder, num_layers=2)
    return folder


def rotvid_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "rotvid.cli", *[str(a) for a in args]], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"rotvid {' '.join(map(str, args[:2]))} did not finish within {DEADLINE_S} s (hang?)")
    return proc.returncode, out, err


needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not available in this torch build",
)


@needs_gloo
def test_generate_gpus_2_on_cpu_writes_one_video_and_a_merged_report(tiny_wan, tmp_path):
    out = tmp_path / "cp.mp4"
    rc, stdout, stderr = rotvid_cli("generate", "-p", "a red cat runs", "--model", tiny_wan, *TINY,
                                    "--backend", "reference", "--schedule", "none", "--gpus", "2", "--out", out,
                                    cwd=tmp_path)
    assert rc == 0, stderr[-3000:]
    assert stderr.count("wrote ") == 1 and stderr.count("loading ") == 1, stderr[-3000:]  # rank 0 only
    side = json.loads(out.with_suffix(".json").read_text())
    report = side["run_report"]
    assert side["gpus"] == 2
    assert report["world_size"] == 2 and report["ranks_agree"] is True
    # every rank's backends and fallback counts, gathered to rank 0 (not only when they differ)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for r in report["ranks"]:
        assert r["total_calls"] == 2 * 2 * 2 and r["quantized_calls"] == r["total_calls"], r
        assert r["fallback_calls"] == 0 and r["fallbacks"] == {} and r["redos"] == [], r
        assert r["backends"] == report["backends"] and sum(r["backends"].values()) == r["quantized_calls"], r
    assert report["total_calls"] == 2 * 2 * 2  # 2 steps x 2 forwards (CFG) x 2 blocks, counted once
    assert report["quantized_calls"] == report["total_calls"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json", "cp.mp4"]

    # the same video from one process: context parallelism changes nothing but rounding
    single = tmp_path / "single" / "one.mp4"
    r = CliRunner().invoke(app, ["generate", "-p", "a red cat runs", "--model", str(tiny_wan), *TINY,
                                 "--backend", "reference", "--schedule", "none", "--quiet", "--out", str(single)])
    assert r.exit_code == 0, r.output
    one = json.loads(single.with_suffix(".json").read_text())
    assert one["gpus"] == 1 and "ranks" not in one["run_report"]
    assert one["initial_noise_sha256"] == side["initial_noise_sha256"]
    assert one["run_report"]["per_block"] == report["per_block"]
    a = np.stack(list(iter_frames(single))).astype(np.int16)
    b = np.stack(list(iter_frames(out))).astype(np.int16)
    assert a.shape == b.shape and np.abs(a - b).max() <= 2


@needs_gloo
def test_eval_gpus_2_on_cpu_generates_and_reports_once(tiny_wan, tmp_path):
    pf = tmp_path / "prompts.txt"
    pf.write_text("a dog\n")
    rc, stdout, stderr = rotvid_cli("eval", "--prompt-file", pf, "--model", tiny_wan, "--variants", "int4:half",
                                    *TINY, "--backend", "reference", "--gpus", "2", "--out", tmp_path / "ev",
                                    cwd=tmp_path)
    assert rc == 0, stderr[-3000:]
    assert stdout.count("report: ") == 1, stdout
    sides = sorted((tmp_path / "ev" / "videos").rglob("*.json"))
    assert len(sides) == 2  # the FP16 reference and the one variant
    variant = [json.loads(p.read_text()) for p in sides if json.loads(p.read_text())["recipe"] == "int4"][0]
    assert variant["run_report"]["world_size"] == 2 and variant["gpus"] == 2
    assert [r["rank"] for r in variant["run_report"]["ranks"]] == [0, 1]
    reference = [json.loads(p.read_text()) for p in sides if json.loads(p.read_text())["recipe"] != "int4"][0]
    assert reference["gpus"] == 2 and reference["run_report"] is None  # the untouched pipeline: no rotvid report


def test_gpus_argument_errors(tiny_wan, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["generate", "-p", "x", "--model", str(tiny_wan), *TINY, "--gpus", "0",
                            "--out", str(tmp_path / "a.mp4")])
    assert_fails(r, "--gpus", "positive")
    if torch.cuda.device_count() < 64:
        r = runner.invoke(app, ["generate", "-p", "x", "--model", str(tiny_wan), "--device", "cuda", "--gpus", "64",
                                "--out", str(tmp_path / "b.mp4")])
        if torch.cuda.is_available():
            assert_fails(r, "--gpus 64", "this machine has")
        else:  # refused before the count: no CUDA at all
            assert_fails(r, "--device cuda")
    r = runner.invoke(app, ["eval", str(tmp_path / "ref.mp4"), str(tmp_path / "c.mp4"), "--gpus", "2"])
    assert_fails(r, "--gpus 2", "only when eval generates")


def test_parallel_bench_help_runs_on_cpu():
    r = subprocess.run([sys.executable, "-m", "benchmarks.parallel_bench", "--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--gpus" in r.stdout and "all-to-all" in r.stdout, r.stderr


def test_check_gpus_refuses_more_processes_than_the_machine_has_gpus(monkeypatch):
    """The count check itself (the CLI test above reaches it only on a machine with CUDA)."""
    from rotvid.distributed_run import check_gpus

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_gpus(2, "cuda")
    check_gpus(2, "auto")
    with pytest.raises(ValueError, match=r"--gpus 3: this machine has 2 CUDA GPU\(s\)"):
        check_gpus(3, "cuda")
    with pytest.raises(ValueError, match=r"--gpus 3: this machine has 2"):
        check_gpus(3, "auto")
    check_gpus(3, "cpu")  # gloo processes: no GPU count


def test_workers_get_every_option_including_the_negative_switches(tiny_wan, tmp_path, monkeypatch):
    """--gpus re-runs the command on torchrun workers from the parsed values: --no-smooth-k/q/v must reach them
    (a False --x/--no-x switch is passed as --no-x), as must the other options."""
    import rotvid.distributed_run as dr

    seen = []
    monkeypatch.setattr(dr, "launch", lambda gpus, cli_args: seen.append((gpus, cli_args)) or 0)
    r = CliRunner().invoke(app, ["generate", "-p", "a cat", "--model", str(tiny_wan), *TINY, "--device", "cpu",
                                 "--gpus", "2", "--no-smooth-k", "--no-smooth-q", "--no-smooth-v", "--recipe", "int4",
                                 "--out", str(tmp_path / "w.mp4")])
    assert r.exit_code == 0, r.output
    (gpus, args), = seen
    assert gpus == 2 and args[0] == "generate"
    for flag in ("--no-smooth-k", "--no-smooth-q", "--no-smooth-v"):
        assert flag in args
    assert not {"--smooth-k", "--smooth-q", "--smooth-v"} & set(args)
    assert args[args.index("--recipe") + 1] == "int4" and args[args.index("--gpus") + 1] == "2"
    assert "--overwrite" not in args  # a plain flag left False stays out
