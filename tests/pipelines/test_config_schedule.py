"""RotvidConfig JSON round-trip and validation; the schedule rules and the paper presets."""

import json

import pytest

from rotvid.pipelines import CONFIG_VERSION, RotvidConfig, Schedule, expected_quantized_fraction, schedule_preset
from rotvid.pipelines.config import smooth_q_for, smooth_v_for


def test_config_json_round_trip(tmp_path):
    cfg = RotvidConfig(
        recipe="int4-sym-p", rotation="learned:rotations/r.safetensors", vo_hadamard=False, smooth_q=True,
        backend="reference", schedule=Schedule(1, 2, 3, 4, fp16_cells=((5, -1), (-2, 7)), name="mine"),
        block_m=64, block_n=32,
    )
    assert RotvidConfig.from_json(cfg.to_json()) == cfg
    path = tmp_path / "cfg.json"
    cfg.to_json(path)
    assert RotvidConfig.from_json(path) == cfg
    assert json.loads(path.read_text())["version"] == CONFIG_VERSION


def test_config_preset_by_name():
    assert RotvidConfig(schedule="paper-hunyuan-t2v").schedule == schedule_preset("paper-hunyuan-t2v")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"recipe": "int3"}, "recipe"),
        ({"rotation": "diagonal"}, "rotation"),
        ({"rotation": "learned:"}, "rotation"),
        ({"backend": "triton"}, "backend"),
        ({"vo_hadamard": 1}, "vo_hadamard"),
        ({"vo_hadamard": "on"}, "vo_hadamard"),
        ({"schedule": "paper-sdxl"}, "schedule"),
        ({"block_n": 0}, "block_n"),
        ({"version": 2}, "version"),
    ],
)
def test_config_bad_values_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RotvidConfig(**kwargs)


def test_config_from_dict_rejects_unknown_keys_and_missing_version():
    d = RotvidConfig().to_dict()
    with pytest.raises(ValueError, match="unknown keys"):
        RotvidConfig.from_dict({**d, "speed": "fast"})
    d.pop("version")
    with pytest.raises(ValueError, match="version"):
        RotvidConfig.from_dict(d)
    with pytest.raises(ValueError, match="not valid JSON"):
        RotvidConfig.from_json("{oops")


@pytest.mark.parametrize(
    "preset,steps,stacks,fraction",
    [
        ("paper-wan2.2-t2v", 40, (40,), 0.81),  # (36/40)^2
        ("paper-wan2.2-i2v", 40, (40,), 0.675),  # 30/40 * 36/40
        ("paper-hunyuan-t2v", 50, (20, 40), 0.88 * 52 / 60),  # per-stack blocks: 76% as in the paper
    ],
)
def test_paper_presets_give_the_paper_fractions(preset, steps, stacks, fraction):
    assert expected_quantized_fraction(schedule_preset(preset), steps, stacks) == pytest.approx(fraction)


def test_schedule_rules_and_table():
    s = Schedule(fp16_first_steps=1, fp16_last_steps=2, fp16_first_blocks=1, fp16_last_blocks=1,
                 fp16_cells=((3, 4), (-3, -2)))

    def reason(step, block, num_steps=10, sizes=(4, 6)):
        stack_start = 0 if block < sizes[0] else sizes[0]
        size = sizes[0] if block < sizes[0] else sizes[1]
        return s.fp16_reason(step=step, num_steps=num_steps, block=block, num_blocks=sum(sizes),
                             block_in_stack=block - stack_start, stack_size=size)

    assert "first 1 steps" in reason(0, 2)
    assert "last 2 steps" in reason(8, 2) and "last 2 steps" in reason(9, 2)
    assert reason(7, 2) is None
    assert "first 1 blocks" in reason(4, 0) and "first 1 blocks" in reason(4, 4)  # each stack
    assert "last 1 blocks" in reason(4, 3) and "last 1 blocks" in reason(4, 9)
    assert reason(4, 5) is None
    assert reason(3, 4 + 0) is not None and reason(3, 5) is None
    assert reason(3, 4) == "schedule: first 1 blocks"  # block 4 is a stack's first block anyway
    assert reason(7, 8) == "schedule: table"  # (-3, -2) -> step 7, block 8
    assert reason(7, 7) is None


@pytest.mark.parametrize(
    "kwargs",
    [{"fp16_first_steps": -1}, {"fp16_last_blocks": 1.5}, {"fp16_cells": ((1,),)}, {"fp16_cells": ((1, "a"),)},
     {"fp16_cells": 5}, {"fp16_cells": None}],
)
def test_schedule_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):  # named
        Schedule(**kwargs)


def test_schedule_round_trip():
    s = Schedule(2, 0, 1, 3, fp16_cells=((0, 1),), name="x")
    assert Schedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ValueError, match="unknown keys"):
        Schedule.from_dict({"fp16_steps": 3})


# ---- recipe "auto" and the smoothing defaults (issues 12 and 13) -----------------------------


def test_config_defaults_auto_recipe_and_k_v_smoothing():
    cfg = RotvidConfig()
    assert cfg.recipe == "auto"
    # V smoothing: the recipe's default (on for the INT4 recipes, off for the FP8-V ones)
    assert (cfg.smooth_k, cfg.smooth_q, cfg.smooth_v) == (True, None, None)
    # Q smoothing: the recipe's default (on where Q is INT4, off for int8-fp8, whose kernels do not smooth Q)
    assert smooth_q_for("int4", None) and smooth_q_for("int4-sym-p", None) and smooth_q_for("int4-fp8", None)
    assert not smooth_q_for("int8-fp8", None) and not smooth_q_for("fp16", None)
    assert smooth_q_for("int8-fp8", True) and not smooth_q_for("int4", False)
    with pytest.raises(ValueError, match="recipe"):
        smooth_q_for("auto", None)
    assert smooth_v_for("int4", None) and smooth_v_for("int4-sym-p", None)
    assert not smooth_v_for("int8-fp8", None) and not smooth_v_for("int4-fp8", None)
    assert smooth_v_for("int8-fp8", True) and not smooth_v_for("int4", False)  # an explicit switch wins
    with pytest.raises(ValueError, match="recipe"):
        smooth_v_for("auto", None)
    with pytest.raises(ValueError, match="smooth_v"):
        RotvidConfig(smooth_v="yes")
    assert RotvidConfig.from_json(RotvidConfig().to_json()).smooth_v is None


def test_config_json_round_trip_with_auto(tmp_path):
    cfg = RotvidConfig(recipe="auto", schedule="paper-wan2.2-t2v")
    d = json.loads(cfg.to_json())
    assert d["recipe"] == "auto" and d["version"] == CONFIG_VERSION
    assert RotvidConfig.from_json(cfg.to_json()) == cfg
    cfg.to_json(tmp_path / "auto.json")
    assert RotvidConfig.from_json(tmp_path / "auto.json").recipe == "auto"


def test_config_json_written_before_auto_keeps_its_meaning():
    """A version-1 file from before issue 13 names its recipe and smoothing: they are kept, not
    replaced by the new defaults."""
    old = {"version": 1, "recipe": "int4", "rotation": "half", "vo_hadamard": True, "smooth_k": True,
           "smooth_q": False, "smooth_v": False, "backend": "auto", "block_m": None, "block_n": None,
           "schedule": Schedule().to_dict()}
    cfg = RotvidConfig.from_dict(old)
    assert cfg.recipe == "int4" and cfg.smooth_v is False
    # a hand-written file that names only some fields gets the defaults for the others
    assert RotvidConfig.from_dict({"version": 1, "rotation": "full"}).recipe == "auto"


def test_vo_hadamard_modes_and_older_booleans():
    assert RotvidConfig().vo_hadamard == "off"  # the default touches no weight and costs nothing
    assert RotvidConfig(vo_hadamard=True).vo_hadamard == "online"  # an older config's True: the rotation, online
    assert RotvidConfig(vo_hadamard=False).vo_hadamard == "off"
    for mode in ("online", "fused", "off"):
        cfg = RotvidConfig(vo_hadamard=mode)
        assert RotvidConfig.from_json(cfg.to_json()).vo_hadamard == mode
