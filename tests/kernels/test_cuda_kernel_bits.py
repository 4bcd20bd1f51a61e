"""Every kernel configuration gives the bits the kernels gave before the one-skeleton rewrite (aa5d692).

The fixture holds the SHA-256 of each output of :func:`benchmarks.skeleton_ab.configurations` (int8-fp8 on the
wgmma and mma.sync paths, int4 on wgmma / s8 / s4 with both key-block sizes, P modes and smoothing switches, head_dim
64 and 128, both layouts, with and without kv_lens, with and without the tail split) on fixed seeded inputs, computed
by the old kernels on an H200. A kernel change meant to keep the numerics must keep every hash; one that changes
them on purpose regenerates the fixture (``python -m benchmarks.skeleton_ab dump``) and says why in RESULTS.md.
"""

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

FIXTURE = Path(__file__).parent / "fixtures" / "kernel_bits_aa5d692.json"


def test_every_configuration_keeps_its_bits():
    if not torch.cuda.is_available():
        pytest.skip("gpu test: no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    fixture = json.loads(FIXTURE.read_text())
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor) != (9, 0) or props.multi_processor_count != fixture["sms"]:
        pytest.skip(f"the fixture is for sm90 with {fixture['sms']} SMs (the tail split depends on the SM count); "
                    f"this GPU is sm{props.major}{props.minor} with {props.multi_processor_count}")
    from benchmarks.skeleton_ab import hash_outputs

    records = hash_outputs()
    assert set(records) == set(fixture["sha256"])
    nan = [n for n, r in records.items() if r.get("nan")]
    differ = [n for n, r in records.items() if r.get("sha256") != fixture["sha256"][n]]
    assert not nan, f"{len(nan)} configurations with NaN, e.g. {nan[:3]}"
    assert not differ, f"{len(differ)} of {len(records)} configurations changed bits, e.g. {differ[:5]}"
