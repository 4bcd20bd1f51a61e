"""The model families as modules: the registry's checks, nothing outside ``rotvid/pipelines/families/`` naming a
family, and the facts of the two families added as one module each (HunyuanVideo 1.5, SkyReels-V2) as the rest of
rotvid reads them (CPU)."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.families import (
    families, family_by_name, family_of_pipeline_class, register_family, schedule_presets, unregister_family,
)
from rotvid.pipelines.processors import RotvidProcessorBase
from rotvid.rope.model_facts import get_rope_facts, rope_facts

PACKAGE = Path(__file__).resolve().parents[2] / "rotvid"
FAMILIES_DIR = PACKAGE / "pipelines" / "families"
PROXY_DIR = PACKAGE / "pipelines" / "proxy"  # the bundled model: a Wan pipeline rotvid builds, by construction


def family_words() -> set[str]:
    """What names a family: its key, its diffusers classes, its tiny pipelines, pipeline classes and presets."""
    words = set()
    for f in families():
        words |= {f.name, *f.transformer_classes, *f.first_frame_pipelines, *(t.name for t in f.tiny)}
        words |= {c for s in f.stacks for c in s.block_classes} | {c for c, _ in f.pipeline_requirements}
        words |= {p.name for p in f.schedule_presets} | {t.pipeline_class for t in f.tiny}
    return words


def mentions(path: Path, words: set[str], root: Path = PACKAGE.parent) -> list[str]:
    """String constants (docstrings aside), names and imported names of ``path`` that are in ``words``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
        and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            word = node.value
        elif isinstance(node, ast.Name):
            word = node.id
        elif isinstance(node, ast.alias):
            word = node.name
        else:
            continue
        if word in words:
            out.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}: {word}")
    return out


def test_nothing_outside_the_family_modules_names_a_family():
    words = family_words()
    assert {"wan", "HunyuanVideo15Transformer3DModel", "SkyReelsV2TransformerBlock", "paper-hunyuan-t2v"} <= words
    found = [m for p in sorted(PACKAGE.rglob("*.py")) if FAMILIES_DIR not in p.parents and PROXY_DIR not in p.parents
             for m in mentions(p, words)]
    assert found == []


def test_the_scan_finds_a_family_named_outside(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""docstrings may say wan."""\nif family == "hunyuan_video":\n    pass\n')
    assert mentions(f, family_words(), tmp_path) == ["x.py:2: hunyuan_video"]


def test_every_registered_family_is_whole():
    names = [f.name for f in families()]
    assert names == ["wan", "hunyuan_video", "cogvideox", "hunyuan_video15", "skyreels_v2"]
    presets = {p.name for p in schedule_presets()} | {"none"}
    for fam in families():
        fam.check()
        assert all(issubclass(s.processor, RotvidProcessorBase) for s in fam.stacks)
        assert fam.rope is not None and fam.rope.family == fam.name and fam.rope.pair_layout == "interleaved"
        assert {fam.default_preset(t) for t in ("t2v", "i2v")} | {m.preset or "none" for m in fam.models} <= presets
        assert fam.tiny and family_of_pipeline_class(fam.tiny[0].pipeline_class) is fam


def test_register_family_refuses_what_another_family_has():
    wan = family_by_name("wan")
    with pytest.raises(ValueError, match="'wan' is already registered"):
        register_family(wan)
    with pytest.raises(ValueError, match="transformer class WanTransformer3DModel belongs to family 'wan'"):
        register_family(dataclasses.replace(wan, name="wan_copy", rope=dataclasses.replace(wan.rope, family="wan_copy"),
                                            models=(), tiny=(), schedule_presets=()))
    with pytest.raises(ValueError, match="family 'x': token_order: expected one of"):
        register_family(dataclasses.replace(wan, name="x", token_order="audio"))
    with pytest.raises(ValueError, match="family 'y': text_arguments"):
        register_family(dataclasses.replace(wan, name="y", rope=None, text_arguments=("encoder_hidden_states",)))
    assert [f.name for f in families()][:1] == ["wan"] and "wan_copy" not in [f.name for f in families()]
    assert "wan_copy" not in rope_facts()  # a refused family registers nothing


def test_a_family_brings_its_rope_facts_to_the_rope_side():
    wan = family_by_name("wan")
    copy = dataclasses.replace(wan, name="wan_copy", rope=dataclasses.replace(wan.rope, family="wan_copy"),
                               transformer_classes=("WanCopyTransformer3DModel",), pipeline_prefix="WanCopy",
                               pipeline_requirements=(), models=(), tiny=(), schedule_presets=())
    register_family(copy)
    try:
        assert get_rope_facts("wan_copy") is copy.rope and list(rope_facts())[-1] == "wan_copy"
    finally:
        unregister_family("wan_copy")
    assert "wan_copy" not in rope_facts() and list(rope_facts()) == [f.name for f in families()]


def test_pipeline_class_goes_to_the_longest_prefix():
    assert family_of_pipeline_class("HunyuanVideo15ImageToVideoPipeline").name == "hunyuan_video15"
    assert family_of_pipeline_class("HunyuanVideoPipeline").name == "hunyuan_video"
    assert family_of_pipeline_class("SkyReelsV2DiffusionForcingPipeline").name == "skyreels_v2"
    assert family_of_pipeline_class("LTXPipeline") is None


@pytest.mark.parametrize(
    "family,fields",
    [
        ("hunyuan_video15", {"family": "hunyuan_video15", "size_multiple": 16, "temporal_factor": 4,
                             "spatial_factor": 16, "rope_max_positions": None, "inner_dim": 128}),
        ("skyreels_v2", {"family": "skyreels_v2", "size_multiple": 16, "temporal_factor": 4, "spatial_factor": 8,
                         "patch_hw": 2, "rope_max_positions": 32, "inner_dim": 128}),
    ],
)
def test_new_family_as_the_cli_reads_it(tiny, family, fields):
    from rotvid.eval.generation import GenerationRequest, fps_for
    from rotvid.pipelines.pipeline_config import default_schedule, read_pipeline_config

    pipe = tiny(family)
    folder = pipe.config._name_or_path
    cfg = read_pipeline_config(folder)
    assert {k: getattr(cfg, k) for k in fields} == fields
    assert ("max_sequence_length" in cfg.call_parameters) == (family == "skyreels_v2")
    assert default_schedule(folder) == "none"  # the paper has no schedule for either
    assert fps_for(pipe, GenerationRequest(prompt="x")) == 24.0


def test_hunyuan15_tiny_folder_fixes_the_pipelines_sizes(tiny, tmp_path):
    from rotvid.pipelines.folder_defaults import read_tiny_pipeline_attributes
    from rotvid.pipelines.loading import load_pipeline

    pipe = tiny("hunyuan_video15")
    folder = Path(pipe.config._name_or_path)
    attrs = {"tokenizer_max_length": 16, "tokenizer_2_max_length": 8, "vision_num_semantic_tokens": 8}
    assert read_tiny_pipeline_attributes(folder) == attrs
    assert {k: getattr(pipe, k) for k in attrs} == attrs
    record = json.loads((folder / "rotvid_tiny.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("model_index.json", "rotvid_tiny.json"):
        (bad / name).write_text((folder / name).read_text())
    for sub in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                "guider"):
        (bad / sub).symlink_to(folder / sub)
    (bad / "rotvid_tiny.json").write_text(json.dumps({**record, "pipeline_attributes": {"max_area": 3}}))
    with pytest.raises(ValueError, match="pipeline_attributes: HunyuanVideo15Pipeline has no int attribute 'max_area'"):
        load_pipeline(bad, dtype=torch.float32)
    (bad / "rotvid_tiny.json").write_text(json.dumps({**record, "pipeline_attributes": {"tokenizer_max_length": -1}}))
    with pytest.raises(ValueError, match="pipeline_attributes: expected an object of attribute names to positive"):
        read_tiny_pipeline_attributes(bad)


def test_skyreels_causal_mask_runs_the_models_attention_and_says_so():
    """A diffusion-forcing SkyReels-V2 transformer with causal blocks passes a block-causal mask to its
    self-attention: no key-padding mask, so every call falls back to the model's own attention, counted."""
    from rotvid.pipelines.tiny import build_tiny_components

    _, comps = build_tiny_components("skyreels_v2", num_layers=2)
    tr = comps["transformer"]
    tr._set_ar_attention(2)
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 4, 4, 4, 4, generator=g), torch.randn(1, 16, 32, generator=g)

    def forward():
        return tr(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([500])).sample

    ref = forward()
    handle = apply(tr, RotvidConfig(recipe="int4", backend="reference"))
    try:
        out = forward()
    finally:
        remove(tr)
    rep = handle.report
    assert rep.quantized_calls == 0 and rep.fallback_calls == rep.total_calls == 2
    (reason,) = rep.fallbacks
    assert "not a per-batch key-padding mask" in reason
    assert (out - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()
