"""Step tracker, key-padding masks, the Q/K rotator and model resolution, without a pipeline."""

import inspect

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

from rotvid.pipelines import StepTracker, StepUnknownError, resolve_model
from rotvid.pipelines.qk_rotation import QKRotator
from rotvid.pipelines.runtime import key_padding_lengths
from rotvid.rope.rotations import make_rotation
from rotvid.rope.tables import apply_rope_interleaved


def test_tracker_counts_scheduler_steps_and_keeps_signatures():
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    before = inspect.signature(sched.set_timesteps)
    tr = StepTracker()
    tr.attach(sched)
    assert "sigmas" in inspect.signature(sched.set_timesteps).parameters  # diffusers checks this
    assert inspect.signature(sched.set_timesteps) == before
    with pytest.raises(StepUnknownError):
        tr.current()
    sched.set_timesteps(5)
    assert tr.current() == (0, 5)
    x = torch.randn(1, 4)
    for i, t in enumerate(sched.timesteps):
        assert tr.current() == (i, 5)
        x = sched.step(torch.randn(1, 4), t, x).prev_sample
    with pytest.raises(StepUnknownError, match="after the last"):
        tr.current()
    sched.set_timesteps(3)
    assert tr.current() == (0, 3) and tr.runs == 2
    tr.detach()
    assert "step" not in vars(sched) and "set_timesteps" not in vars(sched)
    sched.set_timesteps(4)
    assert tr.num_steps == 3


def test_tracker_manual_and_errors():
    tr = StepTracker()
    with pytest.raises(StepUnknownError):
        tr.set_step(0)
    tr.set_step(2, 4)
    assert tr.current() == (2, 4)
    with pytest.raises(ValueError, match="step"):
        tr.set_step(4)
    with pytest.raises(ValueError, match="num_steps"):
        tr.begin(0)
    with pytest.raises(ValueError, match="scheduler"):
        tr.attach(object())
    tr.attach(UniPCMultistepScheduler())
    with pytest.raises(RuntimeError, match="already attached"):
        tr.attach(UniPCMultistepScheduler())


def test_key_padding_lengths():
    n = 7
    lens = torch.tensor([7, 3, 5])
    valid = torch.arange(n)[None] < lens[:, None]
    got, why = key_padding_lengths(valid[:, None, None, :], 3, n)
    assert why is None and got.tolist() == [7, 3, 5] and got.dtype == torch.int32
    additive = torch.zeros(3, n).masked_fill(~valid, float("-inf"))
    assert key_padding_lengths(additive, 3, n)[0].tolist() == [7, 3, 5]
    assert key_padding_lengths(torch.ones(3, 1, 1, n, dtype=torch.bool), 3, n) == (None, None)
    holes = valid.clone()
    holes[0, 2] = False
    assert "prefix" in key_padding_lengths(holes, 3, n)[1]
    empty = valid.clone()
    empty[1] = False
    assert "no valid key" in key_padding_lengths(empty, 3, n)[1]
    assert "bias" in key_padding_lengths(torch.randn(3, n), 3, n)[1]
    assert "key-padding" in key_padding_lengths(torch.ones(3, 2, n, n, dtype=torch.bool), 3, n)[1]


def rope_tables(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(n, d // 2, generator=g, dtype=torch.float64) * 20
    ang = ang.repeat_interleave(2, dim=-1)
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("kind", ["none", "interleaved", "half", "full"])
@pytest.mark.parametrize("span", [(0, 13), (4, 13), (0, 9), (3, 10)])
def test_rotator_keeps_scores_and_matches_rope_then_rotation(kind, span, fuse):
    g = torch.Generator().manual_seed(0)
    d, n = 64, 13
    q = torch.randn(2, 3, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, n, d, generator=g, dtype=torch.float64)
    cos, sin = rope_tables(span[1] - span[0], d, 1)
    rot = make_rotation(kind, d, (16, 24, 24))
    r = QKRotator(rot, fuse=fuse)
    qr, kr = r.rotate(q, (cos, sin), span), r.rotate(k, (cos, sin), span)
    assert (r._cache_table is not None) == fuse

    def rope_only(x):
        a, b = span
        return torch.cat([x[..., :a, :], apply_rope_interleaved(x[..., a:b, :], cos, sin), x[..., b:, :]], dim=-2)

    torch.testing.assert_close(qr @ kr.transpose(-1, -2), rope_only(q) @ rope_only(k).transpose(-1, -2))
    torch.testing.assert_close(qr, rot.apply(rope_only(q)))


def test_rotator_caches_and_reuses_equal_tables():
    rot = make_rotation("half", 64, (16, 24, 24))
    r = QKRotator(rot)
    cos, sin = rope_tables(5, 64, 2)
    x = torch.randn(1, 2, 5, 64)
    r.rotate(x, (cos, sin), (0, 5))
    table = r._cache_table
    r.rotate(x, (cos.clone(), sin.clone()), (0, 5))  # new objects, same values: reused
    assert r._cache_table is table
    cos2, sin2 = rope_tables(5, 64, 3)
    r.rotate(x, (cos2, sin2), (0, 5))
    assert r._cache_table is not table
    with pytest.raises(ValueError, match="rope"):
        r.rotate(x, (cos2, sin2), (0, 4))
    with pytest.raises(ValueError, match="span"):
        r.rotate(x, None, (0, 6))


def test_rotator_without_rope_rotates_every_token():
    rot = make_rotation("half", 64, None)
    x = torch.randn(1, 2, 6, 64, dtype=torch.float64)
    torch.testing.assert_close(QKRotator(rot).rotate(x, None, (0, 0)), rot.apply(x))


def test_resolve_model(tmp_path):
    assert resolve_model(None) == ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", False)
    assert resolve_model("Wan2.2-T2V-A14B") == ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", False)
    assert resolve_model("cogvideox-2b") == ("THUDM/CogVideoX-2b", False)
    assert resolve_model("someone/their-wan") == ("someone/their-wan", False)
    with pytest.raises(ValueError, match="model_index.json"):
        resolve_model(tmp_path)
    (tmp_path / "model_index.json").write_text("{}")
    assert resolve_model(tmp_path) == (str(tmp_path), True)
    with pytest.raises(ValueError, match="model"):
        resolve_model("not-a-model")


def test_load_pipeline_bad_dtype(tmp_path):
    from rotvid.pipelines import load_pipeline

    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(ValueError, match="dtype"):
        load_pipeline(tmp_path, dtype="int8")


def test_runtime_falls_back_on_a_mask_it_cannot_express_and_records_why():
    from rotvid.pipelines import RotvidConfig
    from rotvid.pipelines.report import RunReport
    from rotvid.pipelines.runtime import AttentionSite, Runtime

    tr = StepTracker()
    tr.begin(4)
    tr.set_step(1)
    rep = RunReport(recipe="int4", backend_requested="reference")
    rt = Runtime(RotvidConfig(recipe="int4", backend="reference"), tr, rep)
    site = AttentionSite("transformer", 0, 1, 0, 0, 1)
    rt.add_site(site, torch.nn.Linear(1, 1))  # its call counters live on that module
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 64, generator=g) for _ in range(3))
    sentinel = torch.randn(2, 2, 5, 64, generator=g)
    holes = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    holes[1, ..., 1] = False
    out = rt.attend(site, q, k, v, mask=holes, fp16_attention=lambda: sentinel)
    assert out is sentinel
    assert rep.fallback_calls == 0  # counted on the device until drained
    rt.drain_counts()
    assert rep.fallback_calls == 1 and "prefix" in next(iter(rep.fallbacks))
    padded = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    padded[1, ..., 3:] = False
    out = rt.attend(site, q, k, v, mask=padded, fp16_attention=lambda: sentinel)
    # RotvidConfig smooths Q, K and V for int4 by default (issue 12), the dispatcher's own default is K only
    ref = __import__("rotvid.kernels", fromlist=["attention"]).attention(
        q, k, v, recipe="int4", backend="reference", kv_lens=torch.tensor([5, 3]), smooth_v=True, smooth_q=True)
    rt.drain_counts()
    assert torch.equal(out, ref) and rep.quantized_calls == 1


def test_deferred_table_only_when_one_table_covers_every_token():
    """The table a processor may hand to the attention call (the int8-fp8 CUDA pre-processing applies it itself):
    exactly what rotate applies, and only where rotate is that one table (RoPE on all tokens, a fused rotation)."""
    from rotvid.rope.fused_table import apply_generalized_rope

    rot = make_rotation("half", 64, (16, 24, 24))
    cos, sin = rope_tables(9, 64, 5)
    x = torch.randn(1, 2, 9, 64)
    r = QKRotator(rot)
    table = r.deferred_table(x, (cos, sin), (0, 9))
    assert table is not None and torch.equal(apply_generalized_rope(x, table), r.rotate(x, (cos, sin), (0, 9)))
    # a text span (R alone there: RoPE's identity rows in the same table), either end
    cos4, sin4 = rope_tables(5, 64, 5)
    for span in [(4, 9), (0, 5), (2, 7)]:
        spanned = r.deferred_table(x, (cos4, sin4), span)
        assert spanned is not None and spanned.coef.shape == (9, 64, 4)
        assert torch.equal(apply_generalized_rope(x, spanned), r.rotate(x, (cos4, sin4), span))
    # the full Hadamard: RoPE's table flagged, the same contract
    full = QKRotator(make_rotation("full", 64, None))
    ft = full.deferred_table(x, (cos4, sin4), (4, 9))
    assert ft is not None and ft.hadamard
    assert torch.equal(apply_generalized_rope(x, ft), full.rotate(x, (cos4, sin4), (4, 9)))
    # no RoPE (CogVideoX-2B): R alone on every token, one table of RoPE's identity rows
    plain = r.deferred_table(x, None, (0, 0))
    assert plain is not None and plain.coef.shape == (9, 64, 4)
    assert torch.equal(apply_generalized_rope(x, plain), r.rotate(x, None, (0, 0)))
    torch.testing.assert_close(r.rotate(x, None, (0, 0)), rot.apply(x))
    assert r.deferred_table(x, None, (0, 0)) is plain  # cached
    assert QKRotator(make_rotation("none", 64, None)).deferred_table(x, None, (0, 0)) is None  # nothing to apply
    assert QKRotator(rot, fuse=False).deferred_table(x, (cos, sin), (0, 9)) is None
    with pytest.raises(ValueError, match="rope: expected tables for 4 tokens"):
        r.deferred_table(x, (cos4, sin4), (5, 9))


def test_a_reference_fallback_on_a_gpu_is_warned_once_and_flagged(caplog):
    """auto running the reference because the CUDA kernel refused a call on a GPU is a (slow) fallback: warned once
    per reason and flagged in the summary; on a machine without a GPU the reference is simply the backend."""
    import logging

    from rotvid.pipelines.report import RunReport

    rep = RunReport(recipe="int4", backend_requested="auto")
    refused = "reference (auto; cuda: head_dim 96 (the kernel takes (64, 128)))"
    no_gpu = "reference (auto; cuda: no CUDA GPU (torch.cuda.is_available() is False))"
    with caplog.at_level(logging.WARNING, logger="rotvid.pipelines.report"):
        rep.record_quantized("blocks.0", refused, 3)
        rep.record_quantized("blocks.1", refused, 2)
        rep.record_quantized("blocks.0", no_gpu, 1)
        rep.record_quantized("blocks.0", "cuda (auto)", 4)
    warned = [r.getMessage() for r in caplog.records if "PyTorch reference" in r.getMessage()]
    assert len(warned) == 1 and "head_dim 96" in warned[0]
    summary = rep.summary()
    assert f"backend {refused}: 5 calls  (FALLBACK from the CUDA kernel: slow)" in summary
    assert f"backend {no_gpu}: 1 calls\n" in summary + "\n" and "backend cuda (auto): 4 calls" in summary
