"""The user's weights are the user's: LoRAs, load_state_dict, offloading and casts while rotvid is applied (CPU,
tiny pipelines of every family, diffusers' own LoRA loaders and peft).

With ``vo_hadamard="off"`` (the default) or ``"online"`` nothing rotvid does changes a parameter, so every weight path
gives what it gives without rotvid: with the ``fp16`` recipe, equal within float rounding; with a quantized recipe, within the
recipe's usual distance. ``vo_hadamard="fused"`` refuses each such change with one error.
"""

import pytest
import torch
from peft import LoraConfig  # (the test extra installs peft: these tests never skip)
from peft.utils import get_peft_model_state_dict

from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.tiny import tiny_call_kwargs

FAMILIES = ["wan", "hunyuan_video", "cogvideox", "wan-i2v"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def run(pipe, family, **overrides):
    kw = tiny_call_kwargs(family)
    kw.update(overrides)
    return pipe(**kw).frames


def params(pipe):
    return {k: v.detach().clone() for k, v in pipe.transformer.state_dict().items()}


def assert_same_params(pipe, before):
    after = pipe.transformer.state_dict()
    assert after.keys() == before.keys()
    changed = [k for k in before if after[k].dtype != before[k].dtype or not torch.equal(after[k], before[k])]
    assert not changed, changed[:5]


def scale(ref):
    return ref.abs().max().item()


def add_lora(pipe, name="style", seed=0, rank=4):
    """A random (non-zero) LoRA on the self- and cross-attention projections, as ``add_adapter`` leaves it."""
    torch.manual_seed(seed)
    pipe.transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS, init_lora_weights=False),
                                 adapter_name=name)
    with torch.no_grad():  # larger than peft's random init, so the LoRA moves the output clearly
        for module_name, p in pipe.transformer.named_parameters():
            if "lora_B" in module_name and name in module_name:
                p.mul_(3.0)


def saved_lora(pipe, family, folder, name="style", seed=0):
    """A LoRA file as users get them: added, saved with the pipeline's ``save_lora_weights``, then unloaded."""
    add_lora(pipe, name, seed)
    layers = get_peft_model_state_dict(pipe.transformer, adapter_name=name)
    type(pipe).save_lora_weights(folder, transformer_lora_layers=layers)
    pipe.unload_lora_weights()  # the adapter and its layers gone: the model as it was
    return folder


@pytest.fixture
def lora_dir(tmp_path):
    return tmp_path / "lora"


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_after_apply_equals_the_lora_without_rotvid(tiny, family, lora_dir):
    pipe = tiny(family)
    before = params(pipe)
    saved_lora(pipe, family, lora_dir)
    base = run(pipe, family)
    pipe.load_lora_weights(lora_dir, adapter_name="style")
    try:
        with_lora = run(pipe, family)
    finally:
        pipe.unload_lora_weights()
    assert (with_lora - base).abs().max().item() > 0.05 * scale(base)  # the LoRA moves the output
    apply(pipe, RotvidConfig(recipe="fp16"))
    try:
        pipe.load_lora_weights(lora_dir, adapter_name="style")
        out = run(pipe, family)
        pipe.unload_lora_weights()
    finally:
        remove(pipe)
    torch.testing.assert_close(out, with_lora, rtol=0, atol=2e-5 * scale(with_lora))
    assert_same_params(pipe, before)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_before_apply_quantized_is_within_the_recipes_distance(tiny, family, lora_dir):
    """A LoRA loaded before apply, a quantized recipe with the online V/O Hadamard: the distance to the LoRA output
    without rotvid is the recipe's own on this model -- as with no V/O rotation at all (``off``, which rotates
    nothing) -- never a share of the LoRA's effect (a LoRA that missed a rotation of the weights moved it by that)."""
    pipe = tiny(family)
    before = params(pipe)
    saved_lora(pipe, family, lora_dir)
    base = run(pipe, family)
    pipe.load_lora_weights(lora_dir, adapter_name="style")
    try:
        with_lora = run(pipe, family)
        outs = {}
        for vo in ("off", "online"):
            handle = apply(pipe, RotvidConfig(recipe="int8-fp8", backend="reference", schedule="none", vo_hadamard=vo))
            try:
                outs[vo] = run(pipe, family)
            finally:
                remove(pipe)
            assert handle.report.quantized_calls == handle.report.total_calls > 0
    finally:
        pipe.unload_lora_weights()
    lora_effect = (with_lora - base).abs().max().item()
    recipe_distance = (outs["off"] - with_lora).abs().max().item()
    distance = (outs["online"] - with_lora).abs().max().item()
    assert 0 < distance <= 2 * recipe_distance, (distance, recipe_distance)
    assert distance < 0.05 * lora_effect, (distance, lora_effect)
    assert_same_params(pipe, before)


def test_fuse_set_adapters_unload_and_remove_in_every_order(tiny, lora_dir):
    family = "wan"
    pipe = tiny(family)
    before = params(pipe)
    saved_lora(pipe, family, lora_dir)
    second = lora_dir.parent / "second"
    saved_lora(pipe, family, second, name="motion", seed=1)

    def reference(steps):
        """The same sequence of LoRA operations without rotvid: the output after each."""
        outs = []
        for op in steps:
            op()
            outs.append(run(pipe, family))
        pipe.unload_lora_weights()
        return outs

    steps = [
        lambda: pipe.load_lora_weights(lora_dir, adapter_name="style"),
        lambda: pipe.load_lora_weights(second, adapter_name="motion"),
        lambda: pipe.set_adapters(["style", "motion"], [0.7, 0.4]),
        lambda: pipe.fuse_lora(adapter_names=["style", "motion"]),
        lambda: pipe.unfuse_lora(),
        lambda: pipe.set_adapters(["motion"], [1.0]),
    ]
    expected = reference(steps)
    # fuse then unfuse leaves the base weights rounded (W + dW - dW), with or without rotvid: the runs below must
    # leave exactly these weights
    after_steps = params(pipe)
    pipe.transformer.load_state_dict(before)
    for apply_at in (0, 2, 4, 6):  # rotvid applied before any step, between them, after all
        outs = []
        handle = None
        for i, op in enumerate(steps):
            if i == apply_at:
                handle = apply(pipe, RotvidConfig(recipe="fp16"))
            op()
            outs.append(run(pipe, family))
        if handle is None:
            handle = apply(pipe, RotvidConfig(recipe="fp16"))
        outs.append(run(pipe, family))
        remove(pipe)  # rotvid off first, the LoRAs still on
        after_remove = run(pipe, family)
        pipe.unload_lora_weights()
        assert_same_params(pipe, after_steps)
        pipe.transformer.load_state_dict(before)
        for got, want in zip(outs[apply_at:], expected[apply_at:] + [expected[-1]]):
            torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * scale(want))
        torch.testing.assert_close(after_remove, expected[-1], rtol=0, atol=2e-5 * scale(expected[-1]))


def test_step_distilled_lora_workflow_four_steps_guidance_one(tiny, lora_dir):
    """The common Wan workflow: a step-distillation LoRA, 4 steps, guidance 1 (no negative forward)."""
    family = "wan"
    pipe = tiny(family)
    before = params(pipe)
    saved_lora(pipe, family, lora_dir, name="distill", seed=3)
    call = dict(num_inference_steps=4, guidance_scale=1.0)
    pipe.load_lora_weights(lora_dir, adapter_name="distill")
    try:
        ref = run(pipe, family, **call)
        handle = apply(pipe, RotvidConfig(recipe="fp16"))
        try:
            out = run(pipe, family, **call)
        finally:
            remove(pipe)
    finally:
        pipe.unload_lora_weights()
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-5 * scale(ref))
    assert handle.report.total_calls == 4 * 4  # 4 steps x 4 blocks, one forward per step
    assert_same_params(pipe, before)


@pytest.mark.parametrize("vo", ["off", "online"])
@pytest.mark.parametrize("family", ["wan", "hunyuan_video"])
def test_apply_leaves_every_parameter_bit_identical(tiny, family, vo):
    pipe = tiny(family)
    before = params(pipe)
    ids = {k: v.data_ptr() for k, v in pipe.transformer.named_parameters()}
    apply(pipe, RotvidConfig(recipe="int8-fp8", backend="reference", vo_hadamard=vo))
    try:
        run(pipe, family)
        assert_same_params(pipe, before)
        assert {k: v.data_ptr() for k, v in pipe.transformer.named_parameters()} == ids
    finally:
        remove(pipe)
    assert_same_params(pipe, before)


def test_load_state_dict_and_a_cast_while_applied_compose(tiny):
    """load_state_dict of a fine-tune while applied takes effect (and stays after remove); a cast gives one dtype."""
    family = "cogvideox"
    pipe = tiny(family)
    before = params(pipe)
    tuned = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in before.items()}
    pipe.transformer.load_state_dict(tuned)
    want = run(pipe, family)
    pipe.transformer.load_state_dict(before)
    apply(pipe, RotvidConfig(recipe="fp16"))
    try:
        pipe.transformer.load_state_dict(tuned)
        out = run(pipe, family)
        state = pipe.transformer.to(torch.bfloat16).state_dict()
        assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.bfloat16}
        pipe.transformer.to(torch.float32)
    finally:
        remove(pipe)
    torch.testing.assert_close(out, want, rtol=0, atol=2e-5 * scale(want))
    pipe.transformer.load_state_dict(before)
    assert_same_params(pipe, before)


def test_sequential_cpu_offload_while_applied_gives_the_offloaded_models_output(tiny_dir):
    """accelerate's cpu_offload (what enable_sequential_cpu_offload installs) after apply: the same output as the
    offloaded model without rotvid (a fresh pipeline: offloading cannot be undone in place)."""
    from accelerate import cpu_offload

    from rotvid.pipelines.tiny import build_tiny_pipeline

    family = "wan"
    outs = []
    for with_rotvid in (False, True):
        pipe = build_tiny_pipeline(family, tiny_dir / f"offload-{with_rotvid}")
        pipe.set_progress_bar_config(disable=True)
        ref = run(pipe, family)
        if with_rotvid:
            apply(pipe, RotvidConfig(recipe="fp16"))
        cpu_offload(pipe.transformer, execution_device=torch.device("cpu"))
        outs.append(run(pipe, family))
        if with_rotvid:
            remove(pipe)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=2e-5 * scale(outs[0]))
    torch.testing.assert_close(outs[0], ref, rtol=0, atol=2e-5 * scale(ref))


# ---- vo_hadamard="fused": every weight change is refused with one error --------------------------------------------
def test_fused_refuses_a_lora_loaded_after_apply_and_remove_says_so(tiny, lora_dir):
    family = "wan"
    pipe = tiny(family)
    before = params(pipe)
    saved_lora(pipe, family, lora_dir)
    apply(pipe, RotvidConfig(recipe="fp16", vo_hadamard="fused"))
    try:
        pipe.load_lora_weights(lora_dir, adapter_name="style")
        with pytest.raises(RuntimeError, match=r"vo_hadamard=.fused.*attn1.to_v replaced by peft.*.online."):
            run(pipe, family)
    finally:
        with pytest.raises(RuntimeError, match=r"rotvid is removed, and those weights are left as they are"):
            remove(pipe)
        pipe.unload_lora_weights()
    assert getattr(pipe, "_rotvid_handle", None) is None
    # the unloaded LoRA gave back the fused base layers: the model is not the user's until they reload it
    assert not all(torch.equal(pipe.transformer.state_dict()[k], before[k]) for k in before)
    pipe.transformer.load_state_dict(before)
    assert_same_params(pipe, before)


def test_fused_refuses_a_lora_loaded_before_apply(tiny, lora_dir):
    family = "wan"
    pipe = tiny(family)
    saved_lora(pipe, family, lora_dir)
    pipe.load_lora_weights(lora_dir, adapter_name="style")
    try:
        with pytest.raises(ValueError, match=r"vo_hadamard='fused'.*attn.to_v must be an nn.Linear.*peft.*LoRA"):
            apply(pipe, RotvidConfig(recipe="fp16", vo_hadamard="fused"))
        assert getattr(pipe, "_rotvid_handle", None) is None
        handle = apply(pipe, RotvidConfig(recipe="fp16"))  # the default composes
        handle.remove()
    finally:
        pipe.unload_lora_weights()


def test_fused_refuses_load_state_dict_and_a_written_weight(tiny):
    family = "cogvideox"
    pipe = tiny(family)
    before = params(pipe)
    apply(pipe, RotvidConfig(recipe="fp16", vo_hadamard="fused"))
    try:
        with pytest.raises(RuntimeError, match=r"load_state_dict with .*to_v.weight.*refused"):
            pipe.transformer.load_state_dict(before)
        pipe.transformer.load_state_dict({k: v for k, v in before.items() if "to_q" in k}, strict=False)  # untouched
        run(pipe, family)
        with torch.no_grad():
            pipe.transformer.transformer_blocks[0].attn1.to_out[0].weight.mul_(1.0)
        with pytest.raises(RuntimeError, match=r"to_out.0.weight written in place"):
            run(pipe, family)
    finally:
        with pytest.raises(RuntimeError, match=r"written in place"):
            remove(pipe)
    pipe.transformer.load_state_dict(before)
    assert_same_params(pipe, before)


def test_fused_refuses_an_offloading_hook(tiny_dir):
    from accelerate import cpu_offload

    from rotvid.pipelines.tiny import build_tiny_pipeline

    family = "wan"
    pipe = build_tiny_pipeline(family, tiny_dir / "offload-fused")
    pipe.set_progress_bar_config(disable=True)
    apply(pipe, RotvidConfig(recipe="fp16", vo_hadamard="fused"))
    cpu_offload(pipe.transformer, execution_device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"vo_hadamard='fused'.*replaced \(an offloading hook"):
        run(pipe, family)
    with pytest.raises(RuntimeError, match=r"rotvid is removed"):
        remove(pipe)
