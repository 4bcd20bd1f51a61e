"""The SPARSITY field of ``rotvid eval --variants RECIPE:ROTATION:SPARSITY``: forms, labels, defaults, errors."""

import pytest
import torch

from rotvid.eval.variants import (
    VariantSpec, parse_variant, parse_variant_sparsity, parse_variants, resolve_auto_variants, variant_sparsity_text,
)
from rotvid.kernels.sparsity import SparsitySpec, parse_sparsity


@pytest.mark.parametrize(
    "field, canonical",
    [
        ("topp0.9", "topp:0.9"),
        ("topp0.9+sim=0.3", "topp:0.9,sim=0.3"),
        ("topp+tau=0.9", "topp:0.9"),
        ("radial", "radial"),
        ("radial+band=2+decay=0.25", "radial:band=2,decay=0.25"),
        ("radial+window=none", "radial"),
        ("none", "none"),
    ],
)
def test_variant_form_of_a_spec_parses_and_writes_back(field, canonical):
    spec = parse_variant_sparsity(field, "v")
    assert spec == parse_sparsity(canonical)
    assert parse_variant_sparsity(variant_sparsity_text(spec), "v") == spec


def test_labels_name_the_map_and_a_dense_variant_keeps_its_old_label():
    assert parse_variant("int8-fp8:half:topp0.9").label == "int8-fp8_half_topp0.9"
    assert parse_variant("int8-fp8:half:topp0.9").spec == "int8-fp8:half:topp0.9"
    assert parse_variant("int8-fp8:half:none").label == "int8-fp8_half" == parse_variant("int8-fp8:half").label
    assert parse_variant("int4:half:radial+band=2").label == "int4_half_radial+band=2"
    learned = parse_variant("int4:learned:calib/rotations.safetensors:topp0.8")
    assert learned.rotation == "learned:calib/rotations.safetensors" and learned.sparsity == parse_sparsity("topp:0.8")
    assert learned.label == "int4_learned-rotations_topp0.8"
    assert parse_variant("int4:half:topp0.9").dense_twin == VariantSpec("int4", "half")


def test_the_default_sparsity_fills_the_variants_that_name_none():
    specs = parse_variants("int4:half,int4:half:none,int8-fp8:half:topp0.5", default_sparsity=parse_sparsity("radial"))
    assert [str(s.sparsity) for s in specs] == ["radial", "none", "topp:0.5"]
    assert [s.label for s in specs] == ["int4_half_radial", "int4_half", "int8-fp8_half_topp0.5"]


def test_auto_variants_keep_their_map():
    (spec,), (note,) = resolve_auto_variants([parse_variant("auto:half:topp0.9")], torch.device("cpu"))
    assert spec.recipe != "auto" and spec.sparsity == parse_sparsity("topp:0.9")
    assert note.startswith(f"variant auto:half:topp0.9 runs as {spec.recipe}:half:topp0.9")


@pytest.mark.parametrize(
    "text, match",
    [
        ("int4:half:bogus", "unknown sparsity 'bogus' in 'int4:half:bogus'"),
        ("int4:half:topp", "sparsity 'topp' in 'int4:half:topp'.*needs tau"),
        ("int4:half:topp1.5", "'int4:half:topp1.5'.*tau must be in"),
        ("int4:half:radial+speed=2", "'int4:half:radial\\+speed=2'.*no parameter 'speed'"),
        ("fp16:none:topp0.9", "asks for a block map with recipe fp16"),
        ("int4:diagonal:topp0.9", "unknown rotation 'diagonal'"),
    ],
)
def test_bad_sparsity_fields_name_the_variant(text, match):
    with pytest.raises(ValueError, match="^--variants: .*" + match):
        parse_variant(text)


def test_a_variant_given_its_map_twice_is_refused():
    """``int4:half`` under ``--sparsity topp:0.9`` is ``int4:half:topp0.9``: the same variant twice."""
    with pytest.raises(ValueError, match="listed more than once: int4_half_topp0.9"):
        parse_variants("int4:half:topp0.9,int4:half", default_sparsity=SparsitySpec("topp", {"tau": 0.9}))
