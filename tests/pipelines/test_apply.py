"""apply / remove on tiny random pipelines of every family (CPU, reference backend)."""

import pytest
import torch

import rotvid.pipelines.runtime as runtime
from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.attach import HANDLE_ATTR
from rotvid.pipelines.tiny import tiny_call_kwargs
from rotvid.rope.rotations import save_learned_rotation

FAMILIES = ["wan", "hunyuan_video", "cogvideox", "cogvideox-2b", "hunyuan_video15", "skyreels_v2"]
ROTATIONS = ["none", "interleaved", "half", "full"]
# transformer forwards per denoising step of the tiny calls (cond and uncond apart, or batched)
FORWARDS = {"wan": 2, "hunyuan_video": 1, "cogvideox": 1, "cogvideox-2b": 1, "hunyuan_video15": 2, "skyreels_v2": 2}


def run(pipe, family, **overrides):
    kw = tiny_call_kwargs(family)
    kw.update(overrides)
    return pipe(**kw).frames


def close_to(out, ref):
    """Equal within float32 rounding of a few dozen layers (relative to the output's scale)."""
    tol = 2e-5 * ref.abs().max().item()
    return (out - ref).abs().max().item() <= tol


def self_attentions(pipe):
    from rotvid.pipelines.attach import find_transformers

    family, transformers = find_transformers(pipe)
    out = []
    for t in transformers.values():
        for stack in family.stacks:
            for blk in getattr(t, stack.attr):
                out.append(getattr(blk, stack.self_attention))
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rotation", ROTATIONS)
def test_fp16_recipe_with_rotation_and_vo_hadamard_equals_untouched(tiny, family, rotation):
    pipe = tiny(family)
    ref = run(pipe, family)
    handle = apply(pipe, RotvidConfig(recipe="fp16", rotation=rotation, vo_hadamard="fused"))
    try:
        out = run(pipe, family)
    finally:
        remove(pipe)
    assert close_to(out, ref), (out - ref).abs().max().item()
    # Every self-attention call went through rotvid (3 steps x 4 blocks x forwards per step).
    assert handle.report.total_calls == 3 * 4 * FORWARDS[family]
    assert handle.report.fp16_calls == handle.report.total_calls


@pytest.mark.parametrize("family,lead", [("wan", "blocks"), ("hunyuan_video", "blocks_heads")])
def test_fp16_recipe_with_learned_per_block_rotation_equals_untouched(tiny, tmp_path, family, lead):
    pipe = tiny(family)
    heads = pipe.transformer.config.num_attention_heads
    shape = (4, 32) if lead == "blocks" else (4, heads, 32)
    g = torch.Generator().manual_seed(3)
    angles = torch.rand(shape, generator=g) * 6.28
    reflect = (torch.rand(shape, generator=g) > 0.5).to(torch.int8)
    path = tmp_path / "learned.safetensors"
    save_learned_rotation(path, angles, reflect, pairing="half", head_dim=64,
                          segments=(24, 20, 20) if family == "wan" else (8, 28, 28))
    ref = run(pipe, family)
    apply(pipe, RotvidConfig(recipe="fp16", rotation=f"learned:{path}"))
    try:
        out = run(pipe, family)
        rotators = {id(a.processor.rotator) for a in self_attentions(pipe)}
    finally:
        remove(pipe)
    assert len(rotators) == 4  # one rotation per block
    assert close_to(out, ref)


def test_text_tokens_need_the_rotation_too(tiny, monkeypatch):
    """Guard on the test above: skipping R on CogVideoX's text tokens must break the equality."""
    from rotvid.pipelines import qk_rotation

    pipe = tiny("cogvideox")
    ref = run(pipe, "cogvideox")
    monkeypatch.setattr(qk_rotation.QKRotator, "_rotate_only", lambda self, x: x)
    build = qk_rotation.QKRotator._build

    def without_r_on_text(self, cos, sin, span, x):
        # the fused path's table: the text rows become the identity (no RoPE, no R)
        table = build(self, cos, sin, span, x)
        n = x.shape[-2]
        d = table.head_dim
        eye = torch.zeros(d, 4, dtype=table.coef.dtype)
        eye[torch.arange(d), torch.arange(d) % 2] = 1.0  # index[c] = (e, e + 1, ...): c is slot c - e
        outside = torch.ones(n, dtype=torch.bool)
        outside[span[0] : span[1]] = False
        table.coef[outside] = eye
        return table

    monkeypatch.setattr(qk_rotation.QKRotator, "_build", without_r_on_text)
    apply(pipe, RotvidConfig(recipe="fp16", rotation="half"))
    try:
        out = run(pipe, "cogvideox")
    finally:
        remove(pipe)
    assert not close_to(out, ref)


def hand_count(schedule_rule, steps, stacks, forwards_per_step):
    """Quantized calls per global block, counted by hand from a (step, stack, block) rule."""
    counts = {}
    block = 0
    for size in stacks:
        for i in range(size):
            counts[block] = sum(forwards_per_step for s in range(steps) if schedule_rule(s, i, size))
            block += 1
    return counts


@pytest.mark.parametrize("recipe", ["int8-fp8", "int4-sym-p", "int4-fp8", "nvfp4", "auto"])
def test_schedule_applies_to_every_recipe(tiny, recipe):
    """The step x block schedule is recipe-agnostic: the same hand count for every quantized recipe."""
    pipe = tiny("wan")
    steps = 4
    sched = Schedule(fp16_first_steps=1, fp16_last_steps=1, fp16_first_blocks=1, fp16_last_blocks=0)
    handle = apply(pipe, RotvidConfig(recipe=recipe, rotation="half", backend="reference", schedule=sched))
    try:
        run(pipe, "wan", num_inference_steps=steps)
    finally:
        remove(pipe)
    expected = hand_count(lambda step, i, size: 1 <= step <= steps - 2 and i >= 1, steps, (4,), 2)
    rep = handle.report
    assert {int(k.split("/")[1]): c.quantized for k, c in rep.per_block.items()} == expected
    assert rep.fallback_calls == 0 and rep.fp16_calls == rep.total_calls - sum(expected.values())
    assert rep.recipe == handle.config.recipe == (recipe if recipe != "auto" else "int4")  # auto on the CPU


def test_auto_recipe_is_resolved_once_at_apply_from_the_device(tiny, monkeypatch):
    """apply asks the table for the pipeline's device: a (mocked) Hopper GPU runs int8-fp8, and the
    report keeps the requested recipe and the reason."""
    from rotvid.kernels.recipes import auto as recipe_table

    asked = []

    def capability(device):
        asked.append(device)
        return (9, 0)

    monkeypatch.setattr(recipe_table, "_device_capability", capability)
    monkeypatch.setattr("rotvid.pipelines.attach._execution_device", lambda target, transformers: torch.device("cuda", 0))
    pipe = tiny("wan")
    handle = apply(pipe, RotvidConfig(rotation="half", backend="reference"))
    try:
        run(pipe, "wan")
    finally:
        remove(pipe)
    assert asked == [torch.device("cuda", 0)]  # once, at apply; not per call
    assert handle.config.recipe == "int8-fp8"
    d = handle.report.to_dict()
    assert d["recipe"] == "int8-fp8" and d["recipe_requested"] == "auto"
    assert d["recipe_reason"].startswith("auto on sm90:") and "no INT4 tensor cores" in d["recipe_reason"]
    assert handle.report.quantized_calls == handle.report.total_calls > 0
    assert "recipe int8-fp8: auto on sm90" in handle.report.summary()


@pytest.mark.parametrize(
    "family,stacks,forwards",
    [("wan", (4,), 2), ("hunyuan_video", (2, 2), 1), ("cogvideox", (4,), 1), ("hunyuan_video15", (4,), 2),
     ("skyreels_v2", (4,), 2)],
)
def test_int4_runs_differs_and_fraction_matches_hand_count(tiny, family, stacks, forwards):
    pipe = tiny(family)
    steps = 4
    ref = run(pipe, family, num_inference_steps=steps)
    sched = Schedule(fp16_first_steps=1, fp16_last_steps=1, fp16_first_blocks=1, fp16_last_blocks=0)
    handle = apply(pipe, RotvidConfig(recipe="int4", rotation="half", backend="reference", schedule=sched))
    try:
        out = run(pipe, family, num_inference_steps=steps)
    finally:
        remove(pipe)
    assert torch.isfinite(out).all()
    # Differs well beyond float32 rounding (the fp16-recipe runs stay within ~2e-6 relative).
    assert (out - ref).abs().max().item() > 1e-4 * ref.abs().max().item()

    # By hand: steps 1..2 of 4, and every block but the first of each stack.
    def rule(step, i, size):
        return 1 <= step <= steps - 2 and i >= 1

    expected = hand_count(rule, steps, stacks, forwards)
    rep = handle.report
    got = {int(k.split("/")[1]): c.quantized for k, c in rep.per_block.items()}
    assert got == expected
    total = steps * sum(stacks) * forwards
    assert rep.total_calls == total
    assert rep.fallback_calls == 0
    assert rep.quantized_calls == sum(expected.values())
    assert rep.quantized_fraction == pytest.approx(sum(expected.values()) / total)
    assert set(rep.backends) == {"reference (requested)"}


def test_hunyuan_text_padding_becomes_kv_lens(tiny, monkeypatch):
    pipe = tiny("hunyuan_video")
    seen = []
    real = runtime.prepare_attention  # each quantized call is prepared (validated, backend chosen) once

    def spy(q, k, v, **kw):
        seen.append(None if kw.get("kv_lens") is None else kw["kv_lens"].tolist())
        return real(q, k, v, **kw)

    monkeypatch.setattr(runtime, "prepare_attention", spy)
    apply(pipe, RotvidConfig(recipe="int4", backend="reference"))
    try:
        run(pipe, "hunyuan_video", num_inference_steps=1)
    finally:
        remove(pipe)
    # 32x32 / 5 frames -> 2 x 4 x 4 = 32 video tokens (patch 1); prompt of 7 words + <s> = 8 of 16 text tokens.
    assert seen == [[32 + 8]] * 4


def test_hunyuan15_text_padding_becomes_kv_lens_and_the_model_keeps_its_own_mask(tiny, monkeypatch):
    """HunyuanVideo 1.5's [B, 1, N, N] mask: its key part (video, then the valid text tokens) becomes kv_lens of the
    quantized calls; the FP16 calls get diffusers' own mask."""
    pipe = tiny("hunyuan_video15")
    seen, masks = [], []
    real = runtime.prepare_attention

    def spy(q, k, v, **kw):
        seen.append(None if kw.get("kv_lens") is None else kw["kv_lens"].tolist())
        return real(q, k, v, **kw)

    from diffusers.models.transformers import transformer_hunyuan_video15 as hv15

    real_dispatch = hv15.dispatch_attention_fn
    monkeypatch.setattr(runtime, "prepare_attention", spy)
    apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule=Schedule(fp16_first_blocks=1)))
    try:
        import rotvid.pipelines.processors as processors

        def dispatch(*args, attn_mask=None, **kw):
            masks.append(tuple(attn_mask.shape))
            return real_dispatch(*args, attn_mask=attn_mask, **kw)

        monkeypatch.setattr(processors, "dispatch_attention_fn", dispatch)
        run(pipe, "hunyuan_video15", num_inference_steps=1)
    finally:
        remove(pipe)
    # 32x32 / 5 frames -> 2 x 2 x 2 = 8 video tokens (VAE 16x, patch 1); the tiny text: 8 image + 8 ByT5 + 16 MLLM
    # tokens, valid: the prompt's 7 words (cond), "dark" (uncond); block 0 of each forward runs FP16
    assert seen == [[8 + 7]] * 3 + [[8 + 1]] * 3
    assert masks == [(1, 1, 40, 40)] * 2


def test_unusable_backend_falls_back_to_fp16_and_says_why(tiny):
    pipe = tiny("wan")
    ref = run(pipe, "wan", num_inference_steps=2)
    handle = apply(pipe, RotvidConfig(recipe="int4", rotation="none", vo_hadamard=False, backend="cuda"))
    try:
        out = run(pipe, "wan", num_inference_steps=2)
    finally:
        remove(pipe)
    rep = handle.report
    assert rep.quantized_calls == 0 and rep.fallback_calls == rep.total_calls == 2 * 4 * 2
    (reason,) = rep.fallbacks
    assert "cuda" in reason
    assert close_to(out, ref)


def test_remove_gives_back_bit_identical_weights_processors_and_outputs(tiny):
    pipe = tiny("hunyuan_video")
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    procs = [a.processor for a in self_attentions(pipe)]
    attrs = [dict(vars(a)) for a in self_attentions(pipe)]  # every attribute, the non-persistent buffer names too
    nonpersistent = [set(a._non_persistent_buffers_set) for a in self_attentions(pipe)]
    ref = run(pipe, "hunyuan_video")
    apply(pipe, RotvidConfig(recipe="int4", rotation="half", vo_hadamard="fused", backend="reference"))
    # (the live parameters: state_dict() gives the model's own weights while applied, tests/pipelines/test_contract.py)
    changed = [k for k, v in pipe.transformer.named_parameters() if not torch.equal(v, before[k])]
    assert any("to_v" in k for k in changed) and any("proj_out" in k for k in changed)
    run(pipe, "hunyuan_video")
    remove(pipe)
    after = pipe.transformer.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert [a.processor for a in self_attentions(pipe)] == procs
    assert [set(vars(a)) for a in self_attentions(pipe)] == [set(d) for d in attrs]  # no attribute left behind
    assert [set(a._non_persistent_buffers_set) for a in self_attentions(pipe)] == nonpersistent
    assert torch.equal(run(pipe, "hunyuan_video"), ref)
    assert "set_timesteps" not in vars(pipe.scheduler) and "step" not in vars(pipe.scheduler)
    assert getattr(pipe, HANDLE_ATTR, None) is None
    assert not pipe.transformer._forward_pre_hooks


def test_cross_attention_is_left_alone(tiny):
    pipe = tiny("wan")
    cross = [blk.attn2.processor for blk in pipe.transformer.blocks]
    apply(pipe, RotvidConfig())
    try:
        assert [blk.attn2.processor for blk in pipe.transformer.blocks] == cross
        assert all(type(blk.attn1.processor).__name__ == "WanRotvidAttnProcessor" for blk in pipe.transformer.blocks)
    finally:
        remove(pipe)


def test_wan22_two_experts_preset_counts_steps_across_experts(tiny):
    pipe = tiny("wan2.2", num_layers=6)
    steps = 12
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule="paper-wan2.2-i2v"))
    try:
        run(pipe, "wan2.2", num_inference_steps=steps)
    finally:
        remove(pipe)
    boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    expert = ["transformer" if t >= boundary else "transformer_2" for t in pipe.scheduler.timesteps]
    assert set(expert) == {"transformer", "transformer_2"}
    # Tracker saw one cond + one uncond forward per step, on the expert the pipeline chose.
    assert handle.tracker.forwards_per_step == {s: {expert[s]: 2} for s in range(steps)}
    # paper-wan2.2-i2v: FP16 for the first 6 / last 4 steps and first / last 2 blocks (of 6):
    # quantized = steps 6, 7 x blocks 2, 3, two forwards each, on whichever expert ran them.
    expected = {}
    for s in (6, 7):
        for b in (2, 3):
            key = f"{expert[s]}/{b}"
            expected[key] = expected.get(key, 0) + 2
    got = {k: c.quantized for k, c in handle.report.per_block.items() if c.quantized}
    assert got == expected
    assert handle.report.total_calls == steps * 6 * 2


def test_hunyuan_true_cfg_counts_two_forwards_per_step(tiny):
    pipe = tiny("hunyuan_video")
    handle = apply(pipe, RotvidConfig(recipe="fp16"))
    try:
        run(pipe, "hunyuan_video", negative_prompt="dark", true_cfg_scale=2.0)
    finally:
        remove(pipe)
    assert handle.tracker.forwards_per_step == {s: {"transformer": 2} for s in range(3)}


def test_bare_transformer_outside_a_run_follows_the_block_rules_then_the_step_by_hand(tiny):
    pipe = tiny("cogvideox")
    tr = pipe.transformer
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 4, 4, 4, generator=g)
    text = torch.randn(1, 16, 32, generator=g)
    schedule = Schedule(fp16_first_steps=1, fp16_first_blocks=1)
    handle = apply(tr, RotvidConfig(recipe="int4", backend="reference", schedule=schedule))
    try:
        # no run tracked: the block rules only (block 0 FP16, the step rule not applied), counted as untracked
        tr(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([500]))
        rep = handle.report
        assert rep.fp16_calls == 1 and rep.quantized_calls == 3
        assert rep.untracked_forwards == {"transformer": 1} and rep.to_dict()["untracked_rule"] == rep.untracked_rule
        assert rep.fp16_reasons == {"outside a tracked run, schedule: first 1 blocks": 1}
        handle.reset_report()
        handle.tracker.begin(3)
        tr(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([500]))
        assert handle.report.fp16_calls == 4 and handle.report.quantized_calls == 0
        handle.tracker.set_step(1)
        tr(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([500]))
        assert handle.report.quantized_calls == 3
        assert handle.report.untracked_forwards == {} and handle.tracker.forwards_per_step == {0: {"transformer": 1},
                                                                                               1: {"transformer": 1}}
    finally:
        remove(tr)


def test_apply_errors(tiny):
    pipe = tiny("wan")
    with pytest.raises(ValueError, match="config"):
        apply(pipe, {"recipe": "int4"})
    with pytest.raises(ValueError, match="pipe"):
        apply(object())
    with pytest.raises(ValueError, match="not applied"):
        remove(pipe)
    with pytest.raises(ValueError, match="exact_remove: expected True or False"):
        apply(pipe, RotvidConfig(), exact_remove="no")
    apply(pipe.transformer, RotvidConfig())  # then the pipeline that holds it: named, before anything changes
    try:
        with pytest.raises(ValueError, match="already applied to its transformer"):
            apply(pipe, RotvidConfig())
    finally:
        remove(pipe.transformer)
    apply(pipe, RotvidConfig())
    try:
        with pytest.raises(ValueError, match="already applied"):
            apply(pipe, RotvidConfig())
    finally:
        remove(pipe)
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    pipe.transformer.blocks[2].attn1.fuse_projections()
    try:
        with pytest.raises(ValueError, match="fused QKV"):
            apply(pipe, RotvidConfig())
    finally:
        pipe.transformer.blocks[2].attn1.unfuse_projections()
    # The failed apply (blocks 0, 1 were already installed) left nothing behind.
    after = pipe.transformer.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert getattr(pipe, HANDLE_ATTR, None) is None
    assert all(type(b.attn1.processor).__name__ == "WanAttnProcessor" for b in pipe.transformer.blocks)


def test_replacing_the_scheduler_after_apply_is_followed(tiny):
    pipe = tiny("cogvideox")
    old = pipe.scheduler
    ref = run(pipe, "cogvideox")
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule=Schedule(fp16_first_steps=1)))
    try:
        pipe.scheduler = type(old).from_config(old.config)
        out = run(pipe, "cogvideox")
        new = pipe.scheduler
        assert "step" in vars(new) and "step" not in vars(old)  # the tracker wraps the new one, not the old
    finally:
        pipe.scheduler = old
        remove(pipe)
    assert "step" not in vars(new) and "set_timesteps" not in vars(new)
    rep = handle.report
    assert handle.tracker.forwards_per_step == {s: {"transformer": 1} for s in range(3)}
    assert rep.untracked_forwards == {} and rep.fp16_calls == 4 and rep.quantized_calls == 8
    assert out.shape == ref.shape and torch.isfinite(out).all()


def test_load_pipeline_from_local_folder_keeps_wan_vae_in_float32(tiny, tiny_dir, monkeypatch):
    from rotvid.pipelines import load_pipeline

    tiny("wan")  # makes sure the folder exists
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pipe = load_pipeline(tiny_dir / "wan-4", dtype="bf16")
    assert type(pipe).__name__ == "WanPipeline"
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.text_encoder.dtype == torch.bfloat16
    assert pipe.vae.dtype == torch.float32


def test_remove_without_snapshots_unfuses_arithmetically(tiny):
    pipe = tiny("cogvideox")
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    apply(pipe, RotvidConfig(vo_hadamard="fused"), exact_remove=False)
    remove(pipe)
    after = pipe.transformer.state_dict()
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=1e-6, atol=1e-6)
