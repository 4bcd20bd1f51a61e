"""Shared tiny pipelines: built once per session (save_pretrained + load_pipeline), never from the hub.

Tests that ``apply`` rotvid must leave the pipeline clean; the ``tiny`` fixture removes a handle
left behind by a failing test so one failure does not cascade.
"""

import logging

import pytest

from rotvid.pipelines.attach import HANDLE_ATTR, remove
from rotvid.pipelines.tiny import build_tiny_pipeline

_CACHE = {}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-pipelines")


@pytest.fixture
def tiny(tiny_dir):
    """``tiny(family, num_layers=4)`` -> the cached tiny pipeline of that family."""
    used = []

    def get(family: str, num_layers: int = 4):
        key = (family, num_layers)
        if key not in _CACHE:
            pipe = build_tiny_pipeline(family, tiny_dir / f"{family}-{num_layers}", num_layers=num_layers)
            pipe.set_progress_bar_config(disable=True)
            _CACHE[key] = pipe
        used.append(_CACHE[key])
        return _CACHE[key]

    yield get
    for pipe in used:
        if getattr(pipe, HANDLE_ATTR, None) is not None:
            logging.getLogger(__name__).warning("a test left rotvid applied; removing it")
            remove(pipe)
