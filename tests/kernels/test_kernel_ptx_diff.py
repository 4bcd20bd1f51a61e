"""The old-vs-new kernel comparison (benchmarks/kernel_ptx_diff.py, both families) and the listings it reads
(benchmarks/kernel_listing.py) on fixed texts: no nvcc, no GPU."""
import pytest

from benchmarks import kernel_listing as kl
from benchmarks import kernel_ptx_diff as pd


def test_mma_keys_pair_the_old_and_the_new_kernels():
    # int4_attention_kernel<64, 64, false, kPSym, 4, 4, 2, true> and its mma_attention_kernel twin
    old = "_ZN6rotvid4attn21int4_attention_kernelILi64ELi64ELb0ELi1ELi4ELi4ELi2ELb1EEEvNS_10AttnParamsE"
    new = ("_ZN6rotvid3mma20mma_attention_kernelINS0_12Int4NumericsILi64ELi64ELb0ELi1EEELi4ELi4ELi2ELb1EE"
           "EvNS_10AttnParamsE")
    assert pd.mma_key(old) == pd.mma_key(new) == ("int4", 64, 64, 0, 1, 4, 4, 2, 1)
    # the old int8-fp8 kernel had 2 stages and no lean addressing, not template parameters
    old8 = "_ZN6rotvid4mma828int8fp8_attention_mma_kernelILi128ELi8ELi1EEEvNS_10AttnParamsE"
    new8 = "_ZN6rotvid3mma20mma_attention_kernelINS0_15Int8Fp8NumericsILi128EEELi8ELi1ELi2ELb0EEEvNS_10AttnParamsE"
    assert pd.mma_key(old8) == pd.mma_key(new8) == ("int8fp8", 128, 8, 1, 2, 0)
    sparse8 = "_ZN6rotvid3mma20mma_attention_kernelINS0_15Int8Fp8NumericsILi128EEELi8ELi1ELi2ELb0ELb1EEEvNS_10AttnParamsE"
    assert pd.mma_key(sparse8) == ("int8fp8", 128, 8, 1, 2, 0, "sparse")
    assert pd.mma_key("_ZN6rotvid2wg5otherILi64EEEvv") is None


def test_pre_keys_pair_the_old_and_the_new_kernels():
    # col_stats_kernel<__half, 128> before the V_HADAMARD flag, and its false / true instantiations after it
    old = "_ZN6rotvid4pre816col_stats_kernelI6__halfLi128EEEvNS0_14ColStatsParamsE"
    off = "_ZN6rotvid4pre816col_stats_kernelI6__halfLi128ELb0EEEvNS0_14ColStatsParamsE"
    on = "_ZN6rotvid4pre816col_stats_kernelI6__halfLi128ELb1EEEvNS0_14ColStatsParamsE"
    assert pd.pre_key(old) == pd.pre_key(off) == ("col_stats_kernel", "fp16", 128)
    assert pd.pre_key(on) == ("col_stats_kernel", "fp16", 128, "v_hadamard")
    q8 = "_ZN6rotvid4pre815quantize_kernelI13__nv_bfloat16Li64ELb1EEEvNS_16Int8Fp8PreParamsE"
    assert pd.pre_key(q8) == ("quantize_kernel", "bf16", 64, "v_hadamard")
    # a kernel whose flag is as old as the kernel keeps every argument
    rope = "_ZN6rotvid4pre813rope_q_kernelI13__nv_bfloat16Li128ELb1EEEvNS_13RopePreParamsE"
    assert pd.pre_key(rope) == ("rope_q_kernel", "bf16", 128, 1)
    assert pd.pre_key("_ZN6rotvid4rope23generalized_rope_kernelI6__halfLi64ELb0EEEvNS_15RopeTableParamsE") == (
        "generalized_rope_kernel", "fp16", 64, 0)
    assert pd.pre_key("_Z1av") is None


def test_hopper_keys_pair_the_old_and_the_new_kernels():
    old = "void rotvid::wg8::int8fp8_attention_wgmma_kernel<128, 128, 3, 2, 1, 2, 0>(rotvid::AttnParams)"
    dense = ("void rotvid::hopper::hopper_attention_kernel<rotvid::hopper::Int8Fp8Numerics<128, false>, 3, 2, 1, "
             "false>(rotvid::AttnParams, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)")
    keys = {}
    for name in (old, dense, dense.replace("1, false>(", "1, true>(")):
        tmpl, m = pd.hopper_template(name)
        keys[name] = (tmpl.key_of(m), tmpl.schedule.format(*m.groups()))
    assert keys[old] == ("int8fp8 d128 bn128", "3,2,1 magic=0")
    assert keys[dense] == ("int8fp8 d128 bn128", "3,2,1 magic=false")
    assert keys[dense.replace("1, false>(", "1, true>(")] == ("int8fp8 d128 bn128 sparse", "3,2,1 magic=false")
    tmpl, m = pd.hopper_template("void rotvid::hopper::combine_splits_kernel<64, true>(rotvid::AttnParams)")
    assert tmpl.key_of(m) == "combine d64 sparse" and tmpl.smem is None
    assert pd.hopper_template("void rotvid::hopper::other<1>()") is None


def test_ptxas_resources_per_kernel():
    log = """ptxas info    : Compiling entry function '_Z1av' for 'sm_89'
ptxas info    : Function properties for _Z1av
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 16 bytes cumulative stack size, 504 bytes cmem[0]
ptxas info    : Function properties for _Z1bv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 255 registers, 1024 bytes smem, 504 bytes cmem[0]
"""
    got = kl.ptxas_resources(log)
    assert got["_Z1av"] == {"stack": 16, "spill_stores": 12, "spill_loads": 8, "registers": 128, "smem": 0,
                            "barriers": 1}
    assert got["_Z1bv"] == {"stack": 0, "spill_stores": 0, "spill_loads": 0, "registers": 255, "smem": 1024}


def test_ptx_entries_end_at_their_own_closing_brace():
    # an inline asm block closes its brace at column 0, as nvcc writes it: the entry goes on after it
    ptx = """.visible .entry _Z1av(
	.param .u64 _Z1av_param_0
)
{
	.reg .pred 	%p<2>;
	mov.u32 	%r1, 0;
	// begin inline asm
	{
.reg .pred done;
WAIT_0:
mbarrier.try_wait.parity.shared::cta.b64 done, [%r2], %r3, %r4;
@!done bra WAIT_0;
}

	// end inline asm
	@%p1 bra 	$L__BB0_2;
	mov.b64 	{%r5, %r6}, %rd1;
$L__BB0_2:
	ret;

}
	// .globl	_Z1bv
.visible .entry _Z1bv()
{
	exit;
}
"""
    got = kl.ptx_entries(ptx)
    assert got == {"_Z1av": ["mov.u32 \t%r1, 0;", "mbarrier.try_wait.parity.shared::cta.b64 done, [%r2], %r3, %r4;",
                             "bra WAIT_0;", "bra \t$L__BB0_2;", "mov.b64 \t{%r5, %r6}, %rd1;", "ret;"],
                   "_Z1bv": ["exit;"]}  # (the text as nvcc writes it, tabs kept: the mma family diffs it)
    assert kl.opcode_histogram(got["_Z1av"]) == {"mov.u32": 1, "mbarrier.try_wait.parity.shared::cta.b64": 1,
                                                 "bra": 2, "mov.b64": 1, "ret": 1}


def test_sass_entries_keep_the_guard_and_fold_white_space():
    dump = """	code for sm_89
		Function : _Z1av
	.headerflags	@"EF_CUDA_SM89"
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;  /* 0x00000a00ff017624 */
                                                                             /* 0x000fc40000000f00 */
        /*0010*/              @!P0 BRA   0x40 ;                              /* 0x0000002000008947 */
"""
    got = kl.sass_entries(dump)
    assert got == {"_Z1av": ["IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28]", "@!P0 BRA 0x40"]}
    assert [kl.opcode(i) for i in got["_Z1av"]] == ["IMAD.MOV.U32", "BRA"]


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
    assert kl.opcode_histogram(kl.ptx_instructions("\n".join(old) + "\n$L__BB0_1:\n@%p1 bra $L__BB0_1;")) == {
        "mov.u32": 1, "mov.f32": 2, "selp.f32": 2, "add.s32": 1, "bra": 1}


@pytest.mark.parametrize("argv, words", [
    (["--family", "hopper"], "exactly one of --old, --old-rev"),
    (["--family", "hopper", "--old-rev", "HEAD", "--old", "x"], "exactly one of --old, --old-rev"),
    (["--family", "hopper", "--old-rev", "HEAD", "--archs", "89"], "sm90a only"),
    (["--family", "mma", "--old", "no-such-folder-or-revision"], "--old: expected a saved tree or a git revision"),
    (["--old-rev", "HEAD"], "--family"),
])
def test_bad_command_lines_stop_before_compiling(argv, words, capsys):
    with pytest.raises(SystemExit):
        pd.main(argv)
    assert words in capsys.readouterr().err


def test_a_tree_s_sources_are_the_build_s_in_either_layout(tmp_path):
    """This tree (recipe folders) gives the sources and the include folder the extension build takes
    (rotvid/kernels/cuda_sources.py), from its root or its kernels folder; a flat csrc folder of before the recipe
    folders gives its own files and includes itself."""
    from rotvid.kernels import cuda_sources

    found = cuda_sources.find_sources()
    for given in (kl.REPO, kl.REPO / "rotvid" / "kernels"):
        tree = kl.kernel_tree(given)
        assert sorted(tree.units.values()) == sorted(found.cuda_sources())
        assert sorted(tree.headers.values()) == sorted(found.headers) and tree.include_dirs == found.include_dirs
    assert {"attn_s8_d64.cu", "attn_int8fp8_mma.cu", "preprocess_int4.cu", "rope_table.cu"} <= set(tree.units)
    flat = tmp_path / "csrc"
    flat.mkdir()
    for name in ("attn_s8_d64.cu", "int4_common.cuh", "binding.cpp"):
        (flat / name).write_text("")
    old = kl.kernel_tree(flat)
    assert set(old.units) == {"attn_s8_d64.cu"} and set(old.headers) == {"int4_common.cuh"}
    assert old.include_dirs == (flat.resolve(),) and old.unit("attn_s8_d64.cu") == (flat / "attn_s8_d64.cu").resolve()
    with pytest.raises(SystemExit, match="no source 'attn_s4_d64.cu'"):
        old.unit("attn_s4_d64.cu")


def test_the_hopper_launchers_are_found_in_either_layout():
    tree = kl.kernel_tree(kl.REPO)
    found = sorted(f.name for f in tree.units.values() if pd.HOPPER_LAUNCHER_INCLUDES.search(f.read_text()))
    assert found == ["attn_hopper.cu", "attn_hopper_int4.cu", "attn_hopper_int8fp8.cu"]
    assert pd.HOPPER_LAUNCHER_INCLUDES.search('#include "hopper_launch.cuh"')  # a flat tree's spelling
