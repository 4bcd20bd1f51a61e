"""``RotvidConfig.from_options``: the config of a run from command-line options (rotvid generate / eval)."""

import pytest

from rotvid.pipelines.config import NeedsPipeline, RotvidConfig
from rotvid.pipelines.schedule import Schedule, schedule_preset


def never():
    raise AssertionError("the family's schedule was asked for although it is not needed")


def test_fp16_without_rotation_or_base_is_the_untouched_pipeline():
    assert RotvidConfig.from_options(recipe="fp16", family_schedule=never) is None
    assert RotvidConfig.from_options(recipe="fp16", rotation="half", family_schedule="none").rotation == "half"
    assert RotvidConfig.from_options(base=RotvidConfig(), recipe="fp16").recipe == "fp16"


def test_the_schedule_is_the_given_one_else_the_bases_else_the_familys():
    given = schedule_preset("paper-wan2.2-t2v")
    assert RotvidConfig.from_options(schedule=given, family_schedule=never).schedule == given
    base = RotvidConfig(schedule=given)
    assert RotvidConfig.from_options(base=base, recipe="int4", family_schedule=never).schedule == given
    assert RotvidConfig.from_options(family_schedule=lambda: "paper-wan2.2-t2v").schedule == given
    assert RotvidConfig.from_options(family_schedule=Schedule()).schedule == Schedule()
    with pytest.raises(NeedsPipeline, match="--schedule: the model's family is needed"):
        RotvidConfig.from_options(family_schedule=lambda: None)


def test_options_are_checked_with_the_options_named(tmp_path):
    with pytest.raises(ValueError, match="--sparsity topp:0.9: --recipe fp16 runs the model's own attention"):
        RotvidConfig.from_options(recipe="fp16", sparsity="topp:0.9", family_schedule="none")
    with pytest.raises(ValueError, match="--rotation learned:.*the learned-rotation file does not exist"):
        RotvidConfig.from_options(rotation=f"learned:{tmp_path / 'r.safetensors'}", family_schedule="none")


def test_dense_rules_need_a_block_map_unless_not_strict():
    dense = {"dense_first_steps": 2}
    with pytest.raises(ValueError, match="--dense-first-steps: sparsity rules without a block map"):
        RotvidConfig.from_options(dense=dense, family_schedule="none")
    assert RotvidConfig.from_options(dense=dense, family_schedule="none", strict_dense=False).schedule == \
        schedule_preset("none")
    cfg = RotvidConfig.from_options(sparsity="topp:0.9", dense=dense, family_schedule="none")
    assert cfg.schedule.dense_first_steps == 2
