"""SparsitySpec: the text form (--sparsity), its round trips, the JSON, the errors, and the kind registry."""

import pytest
import torch

from rotvid.kernels.sparsity import (
    SparseMap,
    SparsityKind,
    SparsitySpec,
    build_block_map,
    parse_sparsity,
    register_sparsity_kind,
    sparsity_kind_names,
    unregister_sparsity_kind,
)
from rotvid.kernels.sparsity.block_map import BlockMap
from rotvid.kernels.sparsity.spec import MapParam, accepted_forms


@pytest.mark.parametrize(
    "text, kind, options, canonical",
    [
        ("none", "none", {}, "none"),
        ("radial", "radial", {"band": 1, "window": None, "decay": 0.5}, "radial"),
        ("radial:band=2,decay=0.25", "radial", {"band": 2, "window": None, "decay": 0.25}, "radial:band=2,decay=0.25"),
        (" radial:window=4 ", "radial", {"band": 1, "window": 4, "decay": 0.5}, "radial:window=4"),
        ("topp:0.9", "topp", {"tau": 0.9, "sim": 0.5}, "topp:0.9"),
        ("topp:0.9,sim=0.3", "topp", {"tau": 0.9, "sim": 0.3}, "topp:0.9,sim=0.3"),
        ("topp:tau=0.8,sim=-1", "topp", {"tau": 0.8, "sim": -1.0}, "topp:0.8,sim=-1.0"),
    ],
)
def test_text_form_parses_and_round_trips(text, kind, options, canonical):
    spec = parse_sparsity(text)
    assert (spec.kind, spec.options) == (kind, options)
    assert str(spec) == canonical
    assert parse_sparsity(str(spec)) == spec
    assert SparsitySpec.from_json(spec.to_json()) == spec
    assert SparsitySpec.from_dict(spec.to_dict()) == spec
    assert hash(spec) == hash(parse_sparsity(canonical))
    assert spec.enabled == (kind != "none") and spec.static == (kind != "topp")


def test_spec_from_a_dict_of_params_fills_defaults():
    assert SparsitySpec("topp", {"tau": 0.5}) == parse_sparsity("topp:0.5")
    assert SparsitySpec() == parse_sparsity("none")


@pytest.mark.parametrize(
    "text, match",
    [
        ("dense", r"unknown kind 'dense'; expected none \| radial\[:band=INT,window=INT,decay=FLOAT\] \| topp:TAU\[,sim=FLOAT\]"),
        ("topp", r"topp needs tau .*expected topp:TAU\[,sim=FLOAT\]"),
        ("topp:1.5", r"topp tau must be in \(0, 1\], got 1.5"),
        ("topp:0.9,sim=2", r"topp sim must be in \[-1, 1\]"),
        ("topp:x", r"tau: expected a number, got 'x'"),
        ("radial:band=1.5", r"band: expected an int, got '1.5'"),
        ("radial:decay=0", r"decay must be in \(0, 1\]"),
        ("radial:size=3", r"radial has no parameter 'size'"),
        ("radial:2", r"'2' in 'radial:2' is not NAME=VALUE"),
        ("topp:0.9,tau=0.8", r"tau given twice"),
        ("topp:", r"nothing after ':'"),
        ("", r"expected text"),
    ],
)
def test_errors_name_sparsity_and_the_accepted_forms(text, match):
    with pytest.raises(ValueError, match=r"sparsity \(--sparsity\): .*" + match):
        parse_sparsity(text)


def test_json_errors():
    with pytest.raises(ValueError, match=r"sparsity \(--sparsity\): unknown keys \['extra'\]"):
        SparsitySpec.from_dict({"kind": "none", "extra": 1})
    with pytest.raises(ValueError, match="version must be 1"):
        SparsitySpec.from_dict({"kind": "none", "version": 2})
    with pytest.raises(ValueError, match="not valid JSON"):
        SparsitySpec.from_json("{")


def test_a_new_kind_is_one_registration():
    def build(spec, q, k, *, layout, kv_lens, sm_scale, grid):
        n = q.shape[2]
        mask = torch.eye(-(-n // 128), dtype=torch.bool)
        return SparseMap(BlockMap.from_mask(mask, n_q=n, n_kv=n))

    kind = SparsityKind("diag", "the diagonal only", params=(MapParam("width", "int", 0, lambda v: ""),), build=build)
    register_sparsity_kind(kind)
    try:
        assert "diag" in sparsity_kind_names() and "diag[:width=INT]" in accepted_forms()
        spec = parse_sparsity("diag:width=2")
        q = torch.randn(1, 1, 300, 8)
        out = build_block_map(spec, q, q)
        assert out.block_map.counts.flatten().tolist() == [1, 1, 1]
        with pytest.raises(ValueError, match="already registered"):
            register_sparsity_kind(kind)
    finally:
        unregister_sparsity_kind("diag")
    with pytest.raises(ValueError, match="unknown kind 'diag'"):
        parse_sparsity("diag")


def test_none_builds_no_map():
    q = torch.randn(1, 1, 10, 8)
    assert build_block_map("none", q, q) is None
