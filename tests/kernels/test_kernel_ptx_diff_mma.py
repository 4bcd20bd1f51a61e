"""The old-vs-new kernel comparison (benchmarks/kernel_ptx_diff_mma.py) on fixed texts: no nvcc, no GPU."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
pd = pytest.importorskip("benchmarks.kernel_ptx_diff_mma")


def test_kernel_keys_pair_the_old_and_the_new_kernels():
    # int4_attention_kernel<64, 64, false, kPSym, 4, 4, 2, true> and its mma_attention_kernel twin
    old = "_ZN6rotvid4attn21int4_attention_kernelILi64ELi64ELb0ELi1ELi4ELi4ELi2ELb1EEEvNS_10AttnParamsE"
    new = ("_ZN6rotvid3mma20mma_attention_kernelINS0_12Int4NumericsILi64ELi64ELb0ELi1EEELi4ELi4ELi2ELb1EE"
           "EvNS_10AttnParamsE")
    assert pd.kernel_key(old) == pd.kernel_key(new) == ("int4", 64, 64, 0, 1, 4, 4, 2, 1)
    # the old int8-fp8 kernel had 2 stages and no lean addressing, not template parameters
    old8 = "_ZN6rotvid4mma828int8fp8_attention_mma_kernelILi128ELi8ELi1EEEvNS_10AttnParamsE"
    new8 = "_ZN6rotvid3mma20mma_attention_kernelINS0_15Int8Fp8NumericsILi128EEELi8ELi1ELi2ELb0EEEvNS_10AttnParamsE"
    assert pd.kernel_key(old8) == pd.kernel_key(new8) == ("int8fp8", 128, 8, 1, 2, 0)
    assert pd.kernel_key("_ZN6rotvid2wg5otherILi64EEEvv") is None


def test_ptxas_resources_per_kernel():
    log = """ptxas info    : Compiling entry function '_Z1av' for 'sm_89'
ptxas info    : Function properties for _Z1av
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 16 bytes cumulative stack size, 504 bytes cmem[0]
ptxas info    : Function properties for _Z1bv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 255 registers, 1024 bytes smem, 504 bytes cmem[0]
"""
    got = pd.ptxas_resources(log)
    assert got["_Z1av"] == {"stack": 16, "spill_st": 12, "spill_ld": 8, "regs": 128, "smem": 0}
    assert got["_Z1bv"] == {"stack": 0, "spill_st": 0, "spill_ld": 0, "regs": 255, "smem": 1024}


def test_text_diff_tells_names_order_and_code_apart():
    old = ["mov.u32 %r4, _Z3oldv_param_0;", "mov.f32 %f7, 0f00000000;", "mov.f32 %f9, 0f3F800000;",
           "selp.f32 %f7, %f7, 0fFF800000, %p2;", "selp.f32 %f9, %f9, 0fFF800000, %p2;", "add.s32 %r5, %r4, 1;"]
    renamed = ["mov.u32 %r1, _Z3newv_param_0;", "mov.f32 %f2, 0f00000000;", "mov.f32 %f3, 0f3F800000;",
               "selp.f32 %f2, %f2, 0fFF800000, %p8;", "selp.f32 %f3, %f3, 0fFF800000, %p8;", "add.s32 %r9, %r1, 1;"]
    assert pd.text_diff_lines(old, renamed) == "0"
    swapped = [*renamed[:3], renamed[4], renamed[3], renamed[5]]  # the same two selects, the other way round
    assert pd.text_diff_lines(old, swapped) == "2 (order)"
    changed = [*renamed[:5], "add.s32 %r9, %r1, 2;"]
    assert pd.text_diff_lines(old, changed) == "2"
    assert pd.opcode_histogram(pd._ptx_instructions("\n".join(old) + "\n$L__BB0_1:\n@%p1 bra $L__BB0_1;")) == {
        "mov.u32": 1, "mov.f32": 2, "selp.f32": 2, "add.s32": 1, "bra": 1}
