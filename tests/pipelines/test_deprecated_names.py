"""The INT4-named API kept for one version: each old name still works and warns (DeprecationWarning)."""

from pathlib import Path

import pytest

from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.calibrate import CalibrationOptions, CalibrationResult
from rotvid.pipelines.report import RunReport


def test_run_report_int4_fraction_is_the_quantized_fraction_and_warns():
    rep = RunReport(recipe="int8-fp8", backend_requested="reference")
    rep.record_quantized("transformer/0", "reference", n=3)
    rep.record_fp16("transformer/0", "schedule", n=1)
    with pytest.warns(DeprecationWarning, match="use quantized_fraction"):
        assert rep.int4_fraction == rep.quantized_fraction == 0.75


def test_handle_int4_fraction_is_the_quantized_fraction_and_warns(tiny):
    pipe = tiny("wan", num_layers=2)
    handle = apply(pipe, RotvidConfig(recipe="int4", rotation="none", vo_hadamard=False, backend="reference"))
    try:
        handle.report.record_quantized("transformer/0", "reference", n=1)
        handle.report.record_fp16("transformer/1", "schedule", n=3)
        assert handle.quantized_fraction == 0.25
        with pytest.warns(DeprecationWarning, match="use quantized_fraction"):
            assert handle.int4_fraction == 0.25
    finally:
        remove(pipe)


def test_calibration_result_int4_fraction_is_the_quantized_fraction_and_warns():
    res = CalibrationResult(rotations_path=Path("r.safetensors"), schedule_path=Path("s.json"), quantized_fraction=0.6)
    with pytest.warns(DeprecationWarning, match="use quantized_fraction"):
        assert res.int4_fraction == 0.6


def test_calibration_options_accept_the_old_target_keyword_and_warn():
    assert CalibrationOptions().target_quantized_fraction == 0.8  # the default when neither is given
    with pytest.warns(DeprecationWarning, match="use target_quantized_fraction"):
        opts = CalibrationOptions(target_int4_fraction=0.6)
    assert opts.target_quantized_fraction == 0.6
    with pytest.raises(TypeError, match="target_quantized_fraction: expected it or its old name"):
        CalibrationOptions(target_int4_fraction=0.6, target_quantized_fraction=0.5)
