"""rotvid with the cache hooks diffusers ships (``transformer.enable_cache``) on the tiny pipelines (CPU).

Each run must work, count its steps right although the cache skips blocks (or whole attention calls), and report
the cache and the calls it skipped. diffusers 0.42.1's FasterCache runs on CogVideoX only (on Wan and HunyuanVideo
it fails without rotvid too), so it is tested there.
"""

import pytest
import torch
from diffusers.hooks import (
    FasterCacheConfig,
    FirstBlockCacheConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    TaylorSeerCacheConfig,
)

import rotvid.pipelines.runtime as runtime_module
from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.tiny import tiny_call_kwargs

STEPS = 4
FORWARDS = {"wan": 2, "cogvideox": 1, "hunyuan_video": 1}


def cache_config(kind: str, pipe, family: str):
    timestep = lambda: pipe.current_timestep  # noqa: E731
    if kind == "first-block":
        return FirstBlockCacheConfig(threshold=0.5)
    if kind == "faster":
        return FasterCacheConfig(spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001),
                                 current_timestep_callback=timestep, attention_weight_callback=lambda _: 0.5)
    if kind == "pyramid-attention-broadcast":
        return PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2,
                                               spatial_attention_timestep_skip_range=(-1, 1001),
                                               current_timestep_callback=timestep)
    if kind == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1)
    if kind == "mag":
        return MagCacheConfig(threshold=1.0, num_inference_steps=STEPS, retention_ratio=0.0,
                              mag_ratios=torch.ones(STEPS * FORWARDS[family]))
    raise ValueError(kind)


def run_with_cache(pipe, family, cache, schedule):
    """One run of ``STEPS`` steps with the diffusers ``cache`` hook on and rotvid (int4, reference backend,
    ``schedule``) applied, both taken off after: the frames and rotvid's handle."""
    pipe.transformer.enable_cache(cache)
    try:
        handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule=schedule))
        try:
            return pipe(**tiny_call_kwargs(family, steps=STEPS)).frames, handle
        finally:
            remove(pipe)
    finally:
        pipe.transformer.disable_cache()


CASES = [
    ("first-block", "wan"), ("first-block", "cogvideox"), ("first-block", "hunyuan_video"),
    ("faster", "cogvideox"),
    ("pyramid-attention-broadcast", "wan"), ("pyramid-attention-broadcast", "cogvideox"),
    ("pyramid-attention-broadcast", "hunyuan_video"),
    ("taylorseer", "wan"), ("taylorseer", "hunyuan_video"),
    ("mag", "wan"), ("mag", "cogvideox"),
]
SKIPS = {"first-block", "faster", "pyramid-attention-broadcast", "mag"}  # caches that skip calls at these settings


@pytest.mark.parametrize("kind, family", CASES)
def test_cache_hook_with_rotvid_runs_counts_steps_and_reports(tiny, kind, family):
    pipe = tiny(family)
    config = cache_config(kind, pipe, family)
    out, handle = run_with_cache(pipe, family, config, Schedule(fp16_first_steps=1))
    assert torch.isfinite(out).all()
    rep = handle.report
    forwards = FORWARDS[family]
    # the steps are the scheduler's, whatever the cache skipped inside the forwards
    assert handle.tracker.forwards_per_step == {s: {"transformer": forwards} for s in range(STEPS)}
    assert rep.forwards == {"transformer": STEPS * forwards} and rep.untracked_forwards == {}
    assert rep.caches == {"transformer": type(config).__name__}
    assert rep.skipped_calls == STEPS * forwards * 4 - rep.total_calls
    if kind in SKIPS:
        assert rep.skipped_calls > 0
    assert rep.to_dict()["caches"] == rep.caches and type(config).__name__ in rep.summary()
    # the calls that ran follow the schedule: step 0 FP16, the others quantized
    assert rep.fp16_reasons and set(rep.fp16_reasons) == {"schedule: first 1 steps"}
    assert rep.fallback_calls == 0
    if kind != "mag":  # (MagCache at threshold 1.0 skips every block after step 0)
        assert rep.quantized_calls > 0


def test_a_redo_under_first_block_cache_resets_the_cache_and_is_finite(tiny, monkeypatch):
    pipe = tiny("cogvideox")
    real = runtime_module.run_attention  # every quantized call the runtime makes goes through it
    calls = [0]

    def attention(call, q, k, v, **kw):  # test hook: the 6th quantized call returns inf
        calls[0] += 1
        out = real(call, q, k, v, **kw)
        return torch.full_like(out, float("inf")) if calls[0] == 6 else out

    monkeypatch.setattr(runtime_module, "run_attention", attention)
    out, handle = run_with_cache(pipe, "cogvideox", FirstBlockCacheConfig(threshold=0.5), Schedule())
    assert torch.isfinite(out).all()
    rep = handle.report
    assert len(rep.redos) == 1 and rep.redos[0]["finite_after_redo"]
    assert handle.tracker.forwards_per_step == {s: {"transformer": 1} for s in range(STEPS)}
