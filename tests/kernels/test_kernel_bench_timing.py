"""The kernel benchmark on the CPU: its interleaved timing (``time_ms`` replaced by a recorder), its JSON and
table, and the block-sparse rows' maps (random with the diagonal kept; FlexAttention's BlockMask of the same map)."""
import pytest
import torch

from benchmarks import kernel_bench as kb


def test_rounds_rotate_the_order_and_take_the_median_of_round_medians(monkeypatch):
    calls = []
    times = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 2.0, 9.0]), "c": iter([7.0, 4.0, 4.0])}

    def fake_time_ms(fn, *, min_reps=3, budget_ms=1500.0):
        key = fn()
        calls.append((key, min_reps, budget_ms))
        return next(times[key])

    monkeypatch.setattr(kb, "time_ms", fake_time_ms)
    fns = {"a": lambda: "a", "b": (lambda: "b", 1, 30.0), "c": lambda: "c"}
    got = kb.time_interleaved(fns, rounds=3, budget_ms=900.0)
    assert [c[0] for c in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # every method once per round
    assert got == {"a": 3.0, "b": 2.0, "c": 4.0}  # median of each method's round medians
    assert ("b", 1, 10.0) in calls and ("a", 3, 300.0) in calls  # per-method options, budget split over rounds


def test_no_methods_and_bad_rounds():
    assert kb.time_interleaved({}, rounds=3) == {}
    with pytest.raises(ValueError, match="rounds: expected at least 1, got 0"):
        kb.time_interleaved({"a": lambda: None}, rounds=0)


def test_results_json_keeps_an_untimed_peer_and_rounds_the_ratios(monkeypatch):
    monkeypatch.setattr(kb.torch.cuda, "get_device_name", lambda: "Test GPU")
    monkeypatch.setenv("ROTVID_COMMIT", "abc1234")
    rows = [
        dict(shape="cogvideox5b", method="sdpa-cudnn", ms=10.0, tops=400.0, cos=1.0, note=""),
        dict(shape="cogvideox5b", method="sageattention2-8b", ms=None, tops=None, cos=None, note="not importable: x"),
        dict(shape="cogvideox5b", method="rotvid-int4", ms=8.0, tops=500.04, cos=0.9737812, note=""),
        dict(shape="cogvideox5b", method="rotvid-int4 [wgmma] (attn only)", ms=7.0, tops=571.0, cos=None, note=""),
    ]
    got = kb.results_json(rows)
    assert got["device"] == "Test GPU" and got["commit"] == "abc1234"
    s = got["shapes"]["cogvideox5b"]
    assert set(s) == {"sdpa-cudnn", "sageattention2-8b", "rotvid-int4"}  # table-only rows stay out
    assert s["rotvid-int4"] == {"tops": 500.0, "vs_cudnn": 1.25, "cos_fp64": 0.973781}
    assert s["sageattention2-8b"] == {"tops": None, "vs_cudnn": None, "cos_fp64": None, "note": "not importable: x"}


def test_random_block_map_keeps_the_diagonal_and_the_density():
    bm = kb.random_block_map(3, 40 * 128 - 5, 0.35, seed=1, device="cpu")
    mask = bm.to_dense_mask()
    assert mask.shape == (1, 3, 40, 40)
    assert mask[..., torch.arange(40), torch.arange(40)].all()
    assert (bm.counts == 14).all() and abs(float(bm.density()) - 0.35) < 1e-6  # round(0.35 * 40) per row
    assert not torch.equal(mask[0, 0], mask[0, 1])  # one map per head


def test_flex_block_mask_is_the_same_map():
    """FlexAttention's BlockMask of a map keeps exactly the map's blocks (as full blocks), with a partial last block
    and a map of fewer slots than key blocks."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    n = 9 * 128 - 17
    bm = kb.random_block_map(2, n, 0.5, seed=3, device="cpu")
    block_mask = kb.flex_block_mask(bm)
    assert torch.equal(block_mask.to_dense().bool(), bm.to_dense_mask())
    assert int(block_mask.kv_num_blocks.sum()) == 0  # every kept block full: no mask_mod evaluated
    narrow = kb.BlockMap(bm.indices[..., :5].contiguous(), bm.counts.clamp(max=5), n, n)
    assert torch.equal(kb.flex_block_mask(narrow).to_dense().bool(), narrow.to_dense_mask())


def test_results_json_holds_the_sparse_rows_and_the_map_builds(monkeypatch):
    monkeypatch.setattr(kb.torch.cuda, "get_device_name", lambda: "Test GPU")
    monkeypatch.setenv("ROTVID_COMMIT", "abc1234")
    rows = [
        dict(shape="wan1.3b-480p", method="sdpa-cudnn", ms=10.0, tops=400.0, cos=1.0, note=""),
        dict(shape="wan1.3b-480p", method="rotvid-int8-fp8", ms=7.0, tops=570.0, cos=0.9993, note=""),
        dict(shape="wan1.3b-480p", method="rotvid-int8-fp8-sparse-d0.35 [wgmma] (attn only)", ms=2.0, tops=2000.0,
             cos=None, note="", density=0.3516),
        dict(shape="wan1.3b-480p", method="rotvid-int8-fp8-sparse-d0.35", ms=2.5, tops=1600.0, cos=0.9991, note="",
             density=0.35156, kernel_vs_dense=0.371234, vs_flex=2.01234),
        dict(shape="wan1.3b-480p", method="flexattention-bf16-sparse-d0.35", ms=5.0, tops=800.0, cos=0.99999,
             note="", density=0.35156),
        dict(shape="wan1.3b-480p", method="map build topp:0.9", ms=0.1234, tops=None, cos=None, density=0.123456,
             vs_dense_call=0.0176, note="GPU"),
    ]
    got = kb.results_json(rows)
    s = got["shapes"]["wan1.3b-480p"]
    assert set(s) == {"sdpa-cudnn", "rotvid-int8-fp8", "rotvid-int8-fp8-sparse-d0.35", "flexattention-bf16-sparse-d0.35"}
    assert s["rotvid-int8-fp8-sparse-d0.35"] == {"tops": 1600.0, "vs_cudnn": 4.0, "cos_fp64": 0.9991,
                                                 "density": 0.3516, "kernel_vs_dense": 0.3712, "vs_flex": 2.0123}
    assert s["flexattention-bf16-sparse-d0.35"]["vs_cudnn"] == 2.0
    assert got["map_build"] == {"wan1.3b-480p": {"topp:0.9": {"ms": 0.123, "density": 0.1235, "vs_dense_call": 0.0176,
                                                              "note": "GPU"}}}
    md = kb.markdown(rows, 128)
    assert "| wan1.3b-480p | rotvid-int8-fp8-sparse-d0.35 | 2.50 | 1600 | 4.00× | 0.99910 | density 0.352 |" in md
    assert "| wan1.3b-480p | map build topp:0.9 | 0.12 | — | — | | 1.8% of the dense int8-fp8 call; density 0.123; GPU |" in md
