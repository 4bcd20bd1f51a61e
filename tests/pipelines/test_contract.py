"""diffusers' contract with rotvid applied: state_dict / save_pretrained, head_dims that are not powers of two,
fused QKV projections, and transformer calls outside a tracked run (CPU, tiny pipelines)."""

import pytest
import torch
from diffusers import CogVideoXTransformer3DModel, HunyuanVideoTransformer3DModel, WanTransformer3DModel
from safetensors.torch import load_file

from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.tiny import tiny_call_kwargs


def run(pipe, family, **overrides):
    kw = tiny_call_kwargs(family)
    kw.update(overrides)
    return pipe(**kw).frames


def cogvideox_inputs():
    g = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(1, 2, 4, 4, 4, generator=g),
                encoder_hidden_states=torch.randn(1, 16, 32, generator=g), timestep=torch.tensor([500]))


def test_save_while_applied_writes_the_models_own_weights_and_reapplies_the_same(tiny, tmp_path):
    pipe = tiny("hunyuan_video")  # to_v, add_v_proj, to_out, to_add_out and the single-stream proj_out
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    cfg = RotvidConfig(recipe="int4", backend="reference", vo_hadamard="fused")
    handle = apply(pipe, cfg)
    try:
        live = dict(pipe.transformer.named_parameters())
        assert any(not torch.equal(live[k], before[k]) for k in live)  # fused in the live weights
        state = pipe.transformer.state_dict()
        assert state.keys() == before.keys() and all(torch.equal(state[k], before[k]) for k in before)
        pipe.transformer.save_pretrained(tmp_path / "transformer")
        pipe.save_pretrained(tmp_path / "pipe")
        applied = {k: v.clone() for k, v in pipe.transformer.named_parameters()}
    finally:
        remove(pipe)
    for path in (tmp_path / "transformer", tmp_path / "pipe" / "transformer"):
        saved = load_file(path / "diffusion_pytorch_model.safetensors")
        assert saved.keys() == before.keys() and all(torch.equal(saved[k], before[k]) for k in before)
    # apply on the reloaded checkpoint fuses once: the same weights as apply on the original
    reloaded = HunyuanVideoTransformer3DModel.from_pretrained(tmp_path / "transformer").eval()
    apply(reloaded, cfg)
    try:
        again = dict(reloaded.named_parameters())
        assert all(torch.equal(again[k], applied[k]) for k in applied)
    finally:
        remove(reloaded)
    assert handle.report.total_calls == 0


def test_state_dict_without_snapshots_unfuses_arithmetically(tiny):
    pipe = tiny("cogvideox")
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    apply(pipe, RotvidConfig(vo_hadamard="fused"), exact_remove=False)
    try:
        state = pipe.transformer.state_dict()
    finally:
        remove(pipe)
    for k in before:
        torch.testing.assert_close(state[k], before[k], rtol=1e-6, atol=1e-6)


def tiny_wan_transformer(head_dim: int) -> WanTransformer3DModel:
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=head_dim, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ).eval()


@pytest.mark.parametrize("head_dim, block", [(12, 4), (10, 2)])
def test_head_dim_not_a_power_of_two_gets_a_block_diagonal_vo_hadamard(head_dim, block):
    tr = tiny_wan_transformer(head_dim)
    g = torch.Generator().manual_seed(2)
    inputs = dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=g),
                  encoder_hidden_states=torch.randn(1, 8, 32, generator=g), timestep=torch.tensor([500]))
    before = {k: v.clone() for k, v in tr.state_dict().items()}
    with torch.no_grad():
        ref = tr(**inputs)[0]
    handle = apply(tr, RotvidConfig(recipe="fp16", rotation="half", vo_hadamard="fused"))
    try:
        with torch.no_grad():
            out = tr(**inputs)[0]
        fused = [k for k, v in tr.named_parameters() if not torch.equal(v, before[k])]
    finally:
        remove(tr)
    assert any("attn1.to_v" in k for k in fused) and any("attn1.to_out" in k for k in fused)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5 * ref.abs().max().item())
    (note,) = handle.report.notes
    assert f"blocks of {block}" in note and f"head_dim {head_dim}" in note
    # the quantized recipe runs too (the reference takes any even head_dim)
    handle = apply(tr, RotvidConfig(recipe="int4", backend="reference", schedule=Schedule()))
    try:
        with torch.no_grad():
            out = tr(**inputs)[0]
    finally:
        remove(tr)
    assert torch.isfinite(out).all() and handle.report.quantized_calls == 2
    assert all(torch.equal(v, before[k]) for k, v in tr.state_dict().items())


def test_fuse_qkv_projections_after_apply_is_refused(tiny):
    pipe = tiny("cogvideox")
    apply(pipe, RotvidConfig(recipe="fp16"))
    try:
        for owner in (pipe, pipe.transformer):
            with pytest.raises(RuntimeError, match=r"fuse_qkv_projections\(\): rotvid is applied.*remove"):
                owner.fuse_qkv_projections()
        assert type(pipe.transformer.transformer_blocks[0].attn1.processor).__name__ == "CogVideoXRotvidAttnProcessor"
        # any other replacement of a rotvid processor: the next forward says so instead of bypassing rotvid
        attn = pipe.transformer.transformer_blocks[1].attn1
        ours = attn.processor
        attn.set_processor(ours.original)
        with pytest.raises(RuntimeError, match="transformer/1 was replaced after apply"):
            pipe.transformer(**cogvideox_inputs())
        attn.set_processor(ours)
    finally:
        remove(pipe)
    assert "fuse_qkv_projections" not in vars(pipe) and "fuse_qkv_projections" not in vars(pipe.transformer)


def test_direct_calls_and_a_second_pipeline_follow_the_block_rules(tiny):
    pipe = tiny("cogvideox")
    steps = 3
    schedule = Schedule(fp16_first_steps=1, fp16_first_blocks=1)
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule=schedule))
    try:
        run(pipe, "cogvideox", num_inference_steps=steps)
        tracked = handle.report.to_dict()
        handle.reset_report()
        # after the run: the transformer called directly
        with torch.no_grad():
            out = pipe.transformer(**cogvideox_inputs())[0]
        assert torch.isfinite(out).all()
        # a second pipeline sharing the transformer, with its own scheduler
        scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        second = type(pipe)(**{**pipe.components, "scheduler": scheduler})
        second.set_progress_bar_config(disable=True)
        latents = run(second, "cogvideox", num_inference_steps=steps)
        rep = handle.report
    finally:
        remove(pipe)
    assert tracked["untracked_forwards"] == {} and tracked["fp16_calls"] == 4 + 2 * 1
    assert torch.isfinite(latents).all()
    assert rep.untracked_forwards == {"transformer": 1 + steps} and rep.forwards == {"transformer": 1 + steps}
    # block rules only: block 0 FP16 in every untracked forward, the others quantized (no step rule)
    assert rep.fp16_calls == 1 + steps and rep.quantized_calls == 3 * (1 + steps)
    assert set(rep.fp16_reasons) == {"outside a tracked run, schedule: first 1 blocks"}
    assert rep.to_dict()["untracked_rule"].startswith("outside a tracked run") and "untracked" not in str(
        handle.tracker.forwards_per_step)
    assert handle.tracker.forwards_per_step == {s: {"transformer": 1} for s in range(steps)}
