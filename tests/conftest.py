import pytest
import torch

# the built-in families register their RoPE facts with the RoPE side (rotvid.rope.model_facts)
import rotvid.pipelines.families  # noqa: F401


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
