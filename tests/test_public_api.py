"""The package's face: ``rotvid.apply / remove / RotvidConfig / load_pipeline / attention``, imported on first use."""

import subprocess
import sys

import torch

import rotvid
import rotvid.kernels as kernels
from rotvid.kernels.recipes.auto import auto_recipe


def test_user_api_is_exported():
    from rotvid.pipelines import RotvidConfig, apply, load_pipeline, remove

    assert (rotvid.apply, rotvid.remove, rotvid.RotvidConfig, rotvid.load_pipeline) == (
        apply, remove, RotvidConfig, load_pipeline)
    assert set(rotvid.__all__) >= {"apply", "remove", "RotvidConfig", "load_pipeline", "attention", "__version__"}


def test_import_rotvid_alone_does_not_import_torch():
    code = "import sys, rotvid; print('torch' in sys.modules, rotvid.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", rotvid.__version__]


def test_attention_defaults_to_the_devices_recipe_with_its_smoothing():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 70, 64, generator=g) for _ in range(3))
    recipe, _ = auto_recipe("cpu")
    want = kernels.attention(q, k, v, recipe=recipe, smooth_q=True, smooth_v=True)  # the CPU's int4, Q/V smoothed
    assert torch.equal(rotvid.attention(q, k, v), want)
    plain = kernels.attention(q, k, v, recipe="int8-fp8", smooth_v=False, smooth_q=False)
    assert torch.equal(rotvid.attention(q, k, v, recipe="int8-fp8"), plain)
    assert torch.equal(rotvid.attention(q, k, v, smooth_q=False, smooth_v=False), kernels.attention(q, k, v))
