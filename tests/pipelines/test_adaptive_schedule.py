import json

import pytest

from rotvid.pipelines.adaptive_schedule import (
    AccuracyTable,
    choose_fp16_cells,
    read_schedule,
    schedule_from_accuracy,
    write_schedule,
)
from rotvid.pipelines.schedule import expected_quantized_fraction


def table_with(cos):
    t = AccuracyTable(num_steps=len(cos), num_blocks=len(cos[0]))
    for s, row in enumerate(cos):
        for b, c in enumerate(row):
            t.add(s, b, c, 1 - c)
            t.add(s, b, c, 1 - c)  # two prompts, same value: the mean is c
    return t


COS = [[0.90, 0.999, 0.998], [0.995, 0.97, 0.999], [0.999, 0.999, 0.95], [0.999, 0.999, 0.999]]


def test_cosine_floor_keeps_exactly_the_cells_below_it():
    assert choose_fp16_cells(table_with(COS), cosine_floor=0.99) == [(0, 0), (1, 1), (2, 2)]


def test_target_fraction_drops_the_worst_first():
    t = table_with(COS)
    cells = choose_fp16_cells(t, target_quantized_fraction=0.75)  # 12 cells -> at most 9 quantized
    assert cells == [(0, 0), (1, 1), (2, 2)]
    cells = choose_fp16_cells(t, target_quantized_fraction=0.6)  # at most 7 quantized: 5 FP16
    assert cells == [(0, 0), (0, 2), (1, 0), (1, 1), (2, 2)]  # + 0.995 (4th worst) and 0.998 (5th), sorted


def test_schedule_file_round_trips_and_gives_the_fraction(tmp_path):
    t = table_with(COS)
    sched = schedule_from_accuracy(t, target_quantized_fraction=0.75)
    path = write_schedule(sched, tmp_path / "schedule.json", accuracy=t)
    assert json.loads(path.read_text())["version"] == 1
    back = read_schedule(path)
    assert back == sched
    assert expected_quantized_fraction(back, num_steps=4, stack_sizes=(3,)) == pytest.approx(0.75)


def test_bad_arguments():
    t = table_with(COS)
    with pytest.raises(ValueError, match="cosine_floor, target_quantized_fraction"):
        choose_fp16_cells(t)
    with pytest.raises(ValueError, match="target_quantized_fraction: expected a value in"):
        choose_fp16_cells(t, target_quantized_fraction=1.5)
    with pytest.raises(ValueError, match="step, block: expected within"):
        t.add(4, 0, 1.0, 0.0)


def test_old_target_keyword_still_works_and_warns():
    t = table_with(COS)
    with pytest.warns(DeprecationWarning, match="use target_quantized_fraction"):
        assert choose_fp16_cells(t, target_int4_fraction=0.75) == choose_fp16_cells(t, target_quantized_fraction=0.75)
    with pytest.warns(DeprecationWarning, match="use target_quantized_fraction"):
        assert schedule_from_accuracy(t, target_int4_fraction=0.75) == schedule_from_accuracy(t, target_quantized_fraction=0.75)
    with pytest.raises(TypeError, match="not both"):
        choose_fp16_cells(t, target_int4_fraction=0.75, target_quantized_fraction=0.75)
