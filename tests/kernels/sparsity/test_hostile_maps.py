"""Hostile block maps: every bad map is a ValueError naming ``block_map`` or a defined result, never a crash.

What must hold (issue 39):

* a map of the wrong shape, dtype, device or kind, from any entry point -- the dispatcher, the kernel-level entry
  points' check (:func:`rotvid.kernels.cuda_layout.block_map_operands`), a custom sparsity kind's builder -- is a
  ValueError naming ``block_map``;
* bad values (counts outside [0, Kmax], indices outside [0, Tk), duplicates, rows not ascending) are refused by the
  eager check wherever a map enters, also after the map's tensors were changed in place following a checked call;
  ``values_checked`` is no constructor argument;
* a map no host check saw (under ``torch.compile``, or tensors written behind torch's back) has a defined result:
  counts clamped to [0, Kmax], entries outside [0, Tk) and blocks past ``kv_lens`` skipped wherever they sit, a
  duplicate visited twice (:meth:`BlockMap.visit_counts`) -- on the reference backend exactly the result of the
  clean map it stands for (a duplicate: the float64 softmax with that block's weight doubled), and on the CUDA
  kernels (``@pytest.mark.gpu``: the Hopper wgmma and mma.sync kernels, int8-fp8 and INT4, with and without the tail
  split) a finite output within the kernels' usual bound of the reference twin on the same map.
"""

import functools

import pytest
import torch

from rotvid.kernels import attention, metrics
from rotvid.kernels.cuda_layout import block_map_operands
from rotvid.kernels.sparsity import (
    BlockMap,
    SparseMap,
    SparsityKind,
    build_block_map,
    register_sparsity_kind,
    unregister_sparsity_kind,
)
from tests.kernels.helpers import random_qkv

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)

# The calls: B = 2, H = 2, 300 queries (Tq = 3), 500 keys (Tk = 4), batch 1's keys end at 300 (inside block 2).
B, H, NQ, NKV = 2, 2, 300, 500
TQ, TK = 3, 4
KV_LENS = torch.tensor([500, 300])


def base_mask():
    """bool [B, H, Tq, Tk]: a valid map with full, partial, single-block and empty rows."""
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(B, H, TQ, TK, generator=gen) < 0.5
    mask[0, 0, 0] = True
    mask[0, 1, 1] = False
    mask[1, 0, 2] = torch.tensor([False, False, False, True])  # batch 1: only a block past kv_lens
    return mask


def hostile(name):
    """``(indices, counts)`` int32 [B, H, Tq, Kmax = Tk] / [B, H, Tq]: the base map with one kind of bad value."""
    built = BlockMap.from_mask(base_mask(), n_q=NQ, n_kv=NKV)
    idx, cnt = built.indices.clone(), built.counts.clone()
    row = (0, 1, 0)
    if name == "count_negative":
        cnt[row] = -3
    elif name == "count_int_min":
        cnt[row] = INT_MIN
    elif name == "count_above_kmax":
        cnt[0, 0, 0], cnt[1, 1, 1] = TK + 1, INT_MAX
        idx[0, 0, 0] = idx[1, 1, 1] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    elif name == "index_negative":
        idx[row], cnt[row] = torch.tensor([-1, 1, INT_MIN, 2], dtype=torch.int32), 4
    elif name == "index_equal_tk":
        idx[row], cnt[row] = torch.tensor([0, TK, 2, 3], dtype=torch.int32), 4
    elif name == "index_huge":
        idx[row], cnt[row] = torch.tensor([2**30, 1, INT_MAX, 2**30 + 1], dtype=torch.int32), 4
    elif name == "duplicate":
        idx[row], cnt[row] = torch.tensor([1, 1, 2, 1], dtype=torch.int32), 4
    elif name == "not_ascending":
        idx[row], cnt[row] = torch.tensor([2, 0, 3, 1], dtype=torch.int32), 4
    elif name == "not_ascending_past_kv_lens":  # batch 1 (kv_lens 300): block 3 first, block 2 (cut) in the middle
        idx[1, 1, 0], cnt[1, 1, 0] = torch.tensor([3, 2, 0, 1], dtype=torch.int32), 4
        idx[1, 0, 1], cnt[1, 0, 1] = torch.tensor([3, 1, 0, 3], dtype=torch.int32), 3
    elif name == "padding_garbage":  # entries past the count: never read
        idx[row], cnt[row] = torch.tensor([1, -7, INT_MAX, 99], dtype=torch.int32), 1
    else:
        raise AssertionError(name)
    return idx, cnt


VALUE_CASES = ["count_negative", "count_int_min", "count_above_kmax", "index_negative", "index_equal_tk",
               "index_huge", "duplicate", "not_ascending", "not_ascending_past_kv_lens", "padding_garbage"]
WITHOUT_DUPLICATES = [c for c in VALUE_CASES if c != "duplicate"]


def unchecked(indices, counts, device=None):
    """A map whose values no host check saw -- what a compiled graph's map, or tensors written behind torch's back
    (through ``.data``, another library, a kernel), reach the kernels as: marked checked without a check."""
    device = indices.device if device is None else device
    bm = BlockMap(indices.to(device), counts.to(device), NQ, NKV)
    bm._mark_checked()
    return bm


def clean(bm):
    """The valid map a malformed map without duplicates stands for (:meth:`BlockMap.visit_counts` > 0)."""
    visits = bm.visit_counts()
    assert int(visits.max()) <= 1
    return BlockMap.from_mask(visits > 0, n_q=bm.n_q, n_kv=bm.n_kv)


def qkv(dtype=torch.float32, d=64, seed=0):
    return random_qkv(B, H, NQ, d, n_kv=NKV, dtype=dtype, seed=seed, bias=1.0)


# ---- wrong shapes, dtypes, devices, kinds: ValueError naming block_map --------------------------------------------


def good():
    return BlockMap.from_mask(base_mask(), n_q=NQ, n_kv=NKV)


STRUCTURE_CASES = {
    "indices_float": lambda: BlockMap(good().indices.float(), good().counts, NQ, NKV),
    "counts_int64": lambda: BlockMap(good().indices, good().counts.long(), NQ, NKV),
    "indices_3d": lambda: BlockMap(good().indices[0], good().counts, NQ, NKV),
    "counts_disagree": lambda: BlockMap(good().indices, good().counts[:, :1], NQ, NKV),
    "kmax_zero": lambda: BlockMap(good().indices[..., :0], good().counts, NQ, NKV),
    "kmax_above_tk": lambda: BlockMap(torch.zeros(B, H, TQ, TK + 1, dtype=torch.int32), good().counts, NQ, NKV),
    "tq_wrong": lambda: BlockMap(good().indices[:, :, :2], good().counts[:, :, :2], NQ, NKV),
    "devices_disagree": lambda: BlockMap(good().indices.to("meta"), good().counts, NQ, NKV),
    "n_q_zero": lambda: BlockMap(good().indices, good().counts, 0, NKV),
    "block_not_128": lambda: BlockMap(good().indices, good().counts, NQ, NKV, block=64),
}


@pytest.mark.parametrize("case", list(STRUCTURE_CASES))
def test_a_malformed_structure_is_refused_at_construction(case):
    with pytest.raises(ValueError, match="block_map"):
        STRUCTURE_CASES[case]()


CALL_CASES = {
    "not_a_map": lambda: good().indices,
    "wrong_n_kv": lambda: BlockMap.from_mask(base_mask(), n_q=NQ, n_kv=NKV - 100),
    "wrong_batch": lambda: BlockMap.from_mask(base_mask().repeat(2, 1, 1, 1)[:3], n_q=NQ, n_kv=NKV),
    "wrong_heads": lambda: BlockMap.from_mask(base_mask().repeat(1, 2, 1, 1)[:, :3], n_q=NQ, n_kv=NKV),
    "wrong_device": lambda: BlockMap(good().indices.to("meta"), good().counts.to("meta"), NQ, NKV),
}


@pytest.mark.parametrize("case", list(CALL_CASES))
def test_a_map_that_does_not_fit_the_call_is_refused_by_every_entry_point(case):
    q, k, v = qkv()
    bm = CALL_CASES[case]()
    with pytest.raises(ValueError, match="block_map"):
        attention(q, k, v, recipe="int8-fp8", backend="reference", block_map=bm)
    with pytest.raises(ValueError, match="block_map"):  # the kernel-level entry points' check
        block_map_operands(bm, batch=B, heads=H, n_q=NQ, n_kv=NKV, device=q.device)


# ---- bad values: refused in eager mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in VALUE_CASES])
def test_bad_values_are_refused_by_the_eager_check_of_every_entry_point(case):
    q, k, v = qkv()
    idx, cnt = hostile(case)
    for make in (lambda: BlockMap(idx, cnt, NQ, NKV), lambda: BlockMap(idx.clone(), cnt.clone(), NQ, NKV)):
        with pytest.raises(ValueError, match="block_map: "):
            attention(q, k, v, recipe="int4", backend="reference", block_map=make())
        with pytest.raises(ValueError, match="block_map: "):
            block_map_operands(make(), batch=B, heads=H, n_q=NQ, n_kv=NKV, device=q.device)


def test_values_checked_is_no_constructor_argument_and_cannot_be_set():
    idx, cnt = hostile("index_equal_tk")
    with pytest.raises(TypeError):
        BlockMap(idx, cnt, NQ, NKV, values_checked=True)
    bm = BlockMap(idx, cnt, NQ, NKV)
    with pytest.raises(AttributeError):
        bm.values_checked = True
    assert not bm.values_checked


@pytest.mark.parametrize("edit", ["counts", "indices", "indices_of_a_built_map"])
def test_a_map_changed_in_place_after_a_checked_call_is_checked_again(edit):
    q, k, v = qkv()
    built = good()
    bm = built if edit == "indices_of_a_built_map" else BlockMap(built.indices.clone(), built.counts.clone(), NQ, NKV)
    ref = attention(q, k, v, recipe="int8-fp8", backend="reference", block_map=bm)
    assert bm.values_checked and torch.isfinite(ref).all()
    if edit == "counts":
        bm.counts[0, 0, 0] = TK + 3
    else:
        bm.indices[0, 0, 0, 0] = TK
    assert not bm.values_checked
    with pytest.raises(ValueError, match="block_map: "):
        attention(q, k, v, recipe="int8-fp8", backend="reference", block_map=bm)
    with pytest.raises(ValueError, match="block_map: "):
        block_map_operands(bm, batch=B, heads=H, n_q=NQ, n_kv=NKV, device=q.device)


# ---- values no check saw: the defined result -----------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["fp16", "int4", "int8-fp8"])
@pytest.mark.parametrize("case", WITHOUT_DUPLICATES)
def test_an_unchecked_malformed_map_gives_the_result_of_the_clean_map_it_stands_for(case, recipe):
    q, k, v = qkv(torch.float64 if recipe == "fp16" else torch.float32, seed=len(case))
    bm = unchecked(*hostile(case))
    opts = dict(recipe=recipe, backend="reference", kv_lens=KV_LENS, smooth_v=True)
    out = attention(q, k, v, block_map=bm, **opts)
    assert torch.isfinite(out).all()
    assert torch.equal(out, attention(q, k, v, block_map=clean(bm), **opts))


def weighted_attention_fp64(q, k, v, bm, kv_lens):
    """softmax in float64 where each key's weight is the number of times its query tile visits its block."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    visits = bm.visit_counts().double()
    w = visits.repeat_interleave(128, dim=-2)[..., :NQ, :].repeat_interleave(128, dim=-1)[..., :NKV]
    w = w * (torch.arange(NKV)[None, :] < kv_lens[:, None]).double().view(B, 1, 1, NKV)
    p = torch.exp(s - s.amax(dim=-1, keepdim=True)) * w
    den = p.sum(dim=-1, keepdim=True)
    return torch.where(den > 0, (p @ v) / den.clamp(min=1e-300), torch.zeros_like(q))


def test_an_unchecked_duplicate_is_visited_twice():
    q, k, v = qkv(torch.float64, seed=5)
    bm = unchecked(*hostile("duplicate"))
    assert int(bm.visit_counts()[0, 1, 0, 1]) == 3
    out = attention(q, k, v, recipe="fp16", backend="reference", kv_lens=KV_LENS, block_map=bm)
    ref = weighted_attention_fp64(q, k, v, bm, KV_LENS)
    assert metrics.max_abs_error(ref, out) < 1e-12
    once = attention(q, k, v, recipe="fp16", backend="reference", kv_lens=KV_LENS,
                     block_map=BlockMap.from_mask(bm.visit_counts() > 0, n_q=NQ, n_kv=NKV))
    assert metrics.max_abs_error(once, out) > 1e-3  # the weight changed the row


@pytest.mark.parametrize("case", ["count_above_kmax", "index_negative", "not_ascending_past_kv_lens"])
def test_a_compiled_call_checks_no_value_and_gives_the_defined_result(case):
    """Under torch.compile the host never reads the values (no sync): the defined result, as the clean map's."""
    q, k, v = qkv(seed=11)
    bm = BlockMap(*hostile(case), NQ, NKV)
    opts = dict(recipe="int8-fp8", backend="reference", kv_lens=KV_LENS)
    compiled = torch.compile(functools.partial(attention, **opts), backend="eager", fullgraph=True)
    out = compiled(q, k, v, block_map=bm)
    assert not bm.values_checked  # (nothing marked it)
    assert torch.equal(out, attention(q, k, v, block_map=clean(bm), **opts))


# ---- a custom sparsity kind is user code: its garbage is an error ---------------------------------------------------


def garbage_kind(result):
    def build(spec, q, k, **_):
        return result(q, k)
    return SparsityKind(name="hostile_test_kind", summary="returns garbage", static=False, build=build)


GARBAGE = {
    "a_tensor": lambda q, k: torch.zeros(3),
    "a_map_not_wrapped": lambda q, k: good(),
    "a_sparse_map_of_a_tensor": lambda q, k: SparseMap(good().indices),
    "a_map_for_other_tokens": lambda q, k: SparseMap(BlockMap.dense(NQ + 128, NKV)),
    "a_map_on_another_device": lambda q, k: SparseMap(BlockMap(good().indices.to("meta"), good().counts.to("meta"),
                                                               NQ, NKV)),
}


@pytest.fixture
def registered():
    kinds = []

    def register(kind):
        kinds.append(register_sparsity_kind(kind))
        return kind

    yield register
    for kind in kinds:
        unregister_sparsity_kind(kind.name)


@pytest.mark.parametrize("case", list(GARBAGE))
def test_a_custom_kind_that_builds_garbage_is_a_value_error_naming_block_map(case, registered):
    q, k, _ = qkv()
    registered(garbage_kind(GARBAGE[case]))
    with pytest.raises(ValueError, match="block_map: sparsity kind 'hostile_test_kind'"):
        build_block_map("hostile_test_kind", q, k)


@pytest.mark.parametrize("case", ["index_huge", "count_above_kmax", "not_ascending"])
def test_a_custom_kind_whose_map_holds_bad_values_is_refused_by_the_call(case, registered):
    q, k, v = qkv()
    registered(garbage_kind(lambda q, k: SparseMap(BlockMap(*hostile(case), NQ, NKV))))
    sparse = build_block_map("hostile_test_kind", q, k)
    with pytest.raises(ValueError, match="block_map: "):
        attention(q, k, v, recipe="int8-fp8", backend="reference", block_map=sparse.block_map)


# ---- the CUDA kernels: the defined result, never a crash ------------------------------------------------------------


def cuda_case(case):
    return unchecked(*hostile(case), device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("case", VALUE_CASES)
def test_cuda_kernels_give_the_defined_result_of_an_unchecked_malformed_map(case):
    """Every kernel (Hopper wgmma int8-fp8 and INT4 at block_n 128 and 64, with and without the tail split; the
    mma.sync int8-fp8 and INT4 s8 kernels) on an unchecked malformed map: a finite output within the kernels' bound
    of the reference twin on the same map (its defined result), rows that keep nothing exactly 0."""
    from rotvid.kernels.recipes.int4.ops import pack_reference_quantized
    from rotvid.kernels.recipes.int4.reference import attention_from_quantized, preprocess_int4
    from rotvid.kernels.recipes.int8_fp8.ops import preprocess_int8fp8_cuda
    from tests.kernels import test_cuda_sparse as ts
    from tests.kernels.test_cuda_int8fp8 import needs_sm90
    from tests.kernels.test_cuda_int8fp8_mma import needs_e4m3_mma

    bm = cuda_case(case)
    kv_lens = KV_LENS.cuda()
    dead = (bm.visit_counts() > 0) & (torch.arange(TK, device="cuda")[None, :] * 128 < kv_lens[:, None])[:, None, None]
    dead_rows = (~dead.any(dim=-1)).repeat_interleave(128, dim=-1)[..., :NQ]  # [B, H, NQ]
    for d in (64, 128):
        q, k, v, _ = ts.cuda_qkv(B, H, NQ, NKV, d, torch.bfloat16, "BHND", seed=d + len(case))
        runs = []
        if torch.cuda.get_device_capability() >= (8, 9):
            needs_e4m3_mma()
            kq = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens)
            ref = ts.int8fp8_twin(kq, NQ, NKV, kv_lens, bm)
            paths = [("mma", False)]
            if torch.cuda.get_device_capability()[0] == 9:
                paths += [("wgmma", True), ("wgmma", False)]
            for path, split in paths:
                runs.append((f"int8-fp8 {path} split={split}", ref, ts.run_int8fp8(
                    kq, n_q=NQ, n_kv=NKV, d=d, kv_lens=kv_lens, dtype=torch.bfloat16, layout="BHND", b=B, h=H,
                    block_map=bm, split_tail=split, path=path)))
        int4_paths = [("s8", 64, False)]
        if torch.cuda.get_device_capability()[0] == 9:
            needs_sm90()
            int4_paths += [("wgmma", bn, split) for bn in (64, 128) for split in (True, False)]
        for path, block_n, split in int4_paths:
            ref_q = preprocess_int4(q, k, v, kv_lens=kv_lens, block_n=block_n, smooth_q=True)
            kq = pack_reference_quantized(ref_q, p_mode="range", path=path)
            ref = attention_from_quantized(ref_q, p_mode="range", out_dtype=torch.float32, block_map=bm)
            runs.append((f"int4 {path} bn{block_n} split={split}", ref, ts.run_int4(
                kq, n_q=NQ, n_kv=NKV, d=d, block_n=block_n, kv_lens=kv_lens, p_mode="range", dtype=torch.bfloat16,
                layout="BHND", b=B, h=H, block_map=bm, split_tail=split, path=path)))
        for name, ref, out in runs:
            assert torch.isfinite(out).all(), (case, d, name)
            ts.assert_close_per_head(ref.float(), out.float(), torch.bfloat16)
            assert (out[dead_rows] == 0).all(), (case, d, name)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["int8-fp8", "int4"])
def test_cuda_compiled_call_with_a_malformed_map_gives_the_defined_result(recipe):
    """The compiled dispatcher on the GPU reads no value on the host: the kernels' clamping is the guarantee."""
    from tests.kernels.test_cuda_int8fp8 import needs_sm90

    needs_sm90()
    q, k, v = (t.to("cuda", torch.bfloat16) for t in qkv(seed=21))
    kv_lens = KV_LENS.cuda()
    bm = BlockMap(*(t.cuda() for t in hostile("index_huge")), NQ, NKV)
    opts = dict(recipe=recipe, backend="cuda", kv_lens=kv_lens)
    out = torch.compile(functools.partial(attention, **opts), fullgraph=True)(q, k, v, block_map=bm)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    want = attention(q, k, v, block_map=clean(bm), **opts)
    assert metrics.relative_l2(want.float(), out.float()) < 1e-2


@pytest.mark.gpu
def test_cuda_entry_points_refuse_a_map_on_another_device():
    from rotvid.kernels.recipes.int4.ops import int4_attention_cuda
    from rotvid.kernels.recipes.int8_fp8.ops import int8fp8_attention_cuda
    from tests.kernels.test_cuda_int8fp8 import needs_sm90

    needs_sm90()
    q, k, v = (t.to("cuda", torch.bfloat16) for t in qkv(seed=22))
    for entry in (int8fp8_attention_cuda, int4_attention_cuda):
        with pytest.raises(ValueError, match="block_map: on cpu"):
            entry(q, k, v, block_map=good())
