"""A call is decided once: :func:`rotvid.kernels.dispatch.prepare_attention` resolves the recipe, chooses the backend
and runs its kernel entry's checks, each once; :func:`rotvid.kernels.dispatch.run_attention` looks nothing up and
checks nothing again, and the CUDA backend runs the entry's unchecked body. Counted on the CPU: a toy recipe with a
``"cuda"`` kernel entry whose checks accept every call, and the int8-fp8 / INT4 unchecked bodies with their custom
ops replaced by recorders (the same op arguments as the checked entry points: the same kernel bits)."""

from collections import Counter
from functools import partial

import pytest
import torch

from rotvid.kernels import cuda_backend, dispatch
from rotvid.kernels.recipes import KernelEntry, Recipe, RecipeLabels, register_recipe, unregister_recipe
from rotvid.kernels.recipes import registry
from rotvid.kernels.recipes.int4 import ops as int4_ops
from rotvid.kernels.recipes.int8_fp8 import ops as int8fp8_ops
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise
from rotvid.rope.fused_table import GeneralizedRopeTable

TOY = "counted"


@pytest.fixture
def counted(monkeypatch):
    """The toy recipe registered, and a Counter of its checks, its fusion decisions, its runs and the recipe
    lookups of the dispatcher and the CUDA backend."""
    seen = Counter()

    def check_a(q, k, v, **opts):
        seen["check_a"] += 1

    def check_b(q, k, v, **opts):
        seen["check_b"] += 1

    def fuses_rope(q, k, rope, *, layout):
        seen["fuses_rope"] += 1
        return ""

    def run(q, k, v, **opts):
        seen["run"] += 1
        return v

    def run_unchecked(q, k, v, *, rope=None, **opts):
        seen["run_unchecked"] += 1
        seen["rope given"] += rope is not None
        return v

    entry = KernelEntry(run=run, checks=(check_a, check_b), block_n=lambda device=None: 128, fuses_rope=fuses_rope,
                        run_unchecked=run_unchecked)
    recipe = Recipe(name=TOY, summary="toy: counts", labels=RecipeLabels(datatype="-"), quantized=True,
                    smooth_q=False, smooth_v=False, reference=partial(attention_blockwise),
                    reference_block_n=DEFAULT_BLOCK_N, kernels={"cuda": entry})

    def counting_get_recipe(name):
        seen["get_recipe"] += 1
        return registry.get_recipe(name)

    for module in (dispatch, cuda_backend):
        monkeypatch.setattr(module, "get_recipe", counting_get_recipe)
    register_recipe(recipe)
    try:
        yield seen
    finally:
        unregister_recipe(TOY)


def qkv(n=16, d=64):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, n, d, generator=g) for _ in range(3))


def test_prepare_decides_once_and_run_attention_looks_up_and_checks_nothing(counted):
    q, k, v = qkv()
    call = dispatch.prepare_attention(q, k, v, recipe=TOY, backend="cuda")
    assert call.recipe is registry.get_recipe(TOY) and call.kernel is call.recipe.kernel("cuda")
    assert counted["check_a"] == counted["check_b"] == 1
    assert counted["get_recipe"] == 2  # (the inputs' validation and the CUDA backend's refusal)
    with pytest.raises(TypeError):  # the options are frozen
        call.opts["layout"] = "BNHD"
    assert call.opts["recipe"] == TOY and dict(call.opts)["layout"] == "BHND"

    before = Counter(counted)
    for _ in range(3):
        assert run_out(call, q, k, v) is v
    ran = counted - before
    assert ran == Counter(run_unchecked=3), ran  # no lookup, no check, not the checked entry point


def run_out(call, q, k, v, **kw):
    return dispatch.run_attention(call, q, k, v, **kw)


def test_rope_fusion_is_decided_once_per_run(counted):
    q, k, v = qkv()
    rope = GeneralizedRopeTable(coef=torch.zeros(16, 64, 4), index=torch.zeros(64, 4, dtype=torch.long))
    call = dispatch.prepare_attention(q, k, v, recipe=TOY, backend="cuda")
    before = Counter(counted)
    dispatch.run_attention(call, q, k, v, rope=rope)
    ran = counted - before
    assert ran == Counter(run_unchecked=1, fuses_rope=1, **{"rope given": 1}), ran


def test_the_direct_backend_run_keeps_its_checks(counted):
    q, k, v = qkv()
    cuda_backend.CudaBackend().run(q, k, v, recipe=TOY)
    assert counted["check_a"] == counted["check_b"] == counted["run"] == 1 and counted["run_unchecked"] == 0


def test_a_registered_backend_keeps_the_run_protocol():
    seen = []

    class Plain:
        name = "plain"

        def unsupported_reason(self, q, k, v, **opts):
            return None

        def run(self, q, k, v, **opts):
            seen.append(opts)
            return v

    dispatch.register_backend("plain", Plain())
    try:
        q, k, v = qkv()
        call = dispatch.prepare_attention(q, k, v, recipe="int4", backend="plain")
        assert call.kernel is None
        dispatch.run_attention(call, q, k, v, layout="BHND")
        assert seen == [dict(call.opts)]
    finally:
        dispatch._BACKENDS.pop("plain")


# ---- the kernels' unchecked bodies: no kernel-level check, the same op arguments --------------------------------


class Recorder:
    """Stand-ins for a recipe's custom ops (recording their arguments) and its kernel-level checks (counted)."""

    def __init__(self, monkeypatch, ops, *, checks, ops_fakes, sizes):
        self.calls, self.checks = [], Counter()
        checks = {"check_inputs": lambda *a: sizes, **checks}
        for name, fn in checks.items():
            monkeypatch.setattr(ops, name, self.counting(name, fn or getattr(ops, name)))
        for name, fake in ops_fakes.items():
            monkeypatch.setattr(ops, name, self.recording(name, fake))
        monkeypatch.setattr(ops, "kv_lens_int32", lambda kv_lens, device: kv_lens)

    def counting(self, name, fn):
        def counted(*args, **kwargs):
            self.checks[name] += 1
            return fn(*args, **kwargs)

        return counted

    def recording(self, name, fake):
        def op(*args):
            self.calls.append((name, args))
            return fake(*args)

        return op


def same_args(a, b):
    assert [name for name, _ in a] == [name for name, _ in b]
    for (_, xs), (_, ys) in zip(a, b):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):
            assert (torch.equal(x, y) and x.dtype == y.dtype) if isinstance(x, torch.Tensor) else x == y, (x, y)


def operands(dtypes):
    return lambda *args: tuple(torch.zeros(1, 2, dtype=dt) for dt in dtypes)


def output(*args):
    return torch.zeros(1, 2, 200, 128, dtype=torch.half)


def test_the_int8fp8_body_checks_nothing_and_gives_the_ops_the_checked_arguments(monkeypatch):
    q, k, v = (t.half() for t in qkv(200, 128))
    rec = Recorder(
        monkeypatch, int8fp8_ops, sizes=(1, 2, 200, 128, 200),
        checks={"_check_int8fp8_device": lambda device, path=None: "mma", "block_map_operands": None,
                "check_output_args": None, "check_sm_scale": None, "scale_and_map_operands": None},
        ops_fakes={"_int8fp8_preprocess_op": operands([torch.int8, torch.float32] * 3 + [torch.float32]),
                   "_int8fp8_attention_op": output},
    )
    monkeypatch.setattr(int8fp8_ops.cuda_build, "capability", lambda device: (8, 9))  # (the arch default: mma)

    int8fp8_ops.int8fp8_attention_unchecked(q, k, v, sm_scale=0.1, smooth_v=True)
    assert not rec.checks, rec.checks
    unchecked = rec.calls[:]
    rec.calls.clear()
    kq = int8fp8_ops.preprocess_int8fp8_cuda(q, k, v, smooth_v=True)
    int8fp8_ops.attention_int8fp8_quantized(kq, n_q=200, n_kv=200, head_dim=128, sm_scale=0.1, out_dtype=q.dtype)
    same_args(unchecked, rec.calls)  # what the public pre-processing + attention give the same ops
    assert rec.checks["check_inputs"] == 1 and rec.checks["_check_int8fp8_device"] == 2


def test_the_int4_body_checks_nothing_and_gives_the_ops_the_checked_arguments(monkeypatch):
    q, k, v = (t.half() for t in qkv(200, 128))
    rec = Recorder(
        monkeypatch, int4_ops, sizes=(1, 2, 200, 128, 200),
        checks={"_check_path": lambda path, device: "auto", "block_map_operands": None, "check_output_args": None,
                "check_sm_scale": None, "scale_and_map_operands": None},
        ops_fakes={"_int4_preprocess_op": operands([torch.int8, torch.float32] * 2 + [torch.int8] + [torch.float32] * 3),
                   "_int4_attention_op": output},
    )
    monkeypatch.setattr(int4_ops, "default_block_n", lambda device=None: 64)
    monkeypatch.setattr(int4_ops, "_resolve_path", lambda path, device: "s8")  # (vt's dtype: int8)

    int4_ops.int4_attention_unchecked(q, k, v, sm_scale=0.1, smooth_q=True, smooth_v=True)
    assert not rec.checks, rec.checks
    unchecked = rec.calls[:]
    rec.calls.clear()
    kq = int4_ops.preprocess_int4_cuda(q, k, v, sm_scale=0.1, smooth_q=True, smooth_v=True)
    int4_ops.attention_int4_quantized(kq, n_q=200, n_kv=200, head_dim=128, sm_scale=0.1, out_dtype=q.dtype)
    same_args(unchecked, rec.calls)
