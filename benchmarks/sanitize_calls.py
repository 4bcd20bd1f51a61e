"""compute-sanitizer over rotvid's attention kernels: small dense and block-sparse calls, with and without the
tail split, under racecheck, initcheck, synccheck and memcheck; one summary line per tool.

    python -m benchmarks.sanitize_calls [--tools racecheck,initcheck,synccheck,memcheck] [--out DIR]
    python -m benchmarks.sanitize_calls --calls          # the calls alone (what each sanitizer run executes)

The calls (``--calls``; every one on fresh, seeded inputs, one head, N = 600 queries and keys, kv_lens 500, so
the 5 query tiles of 128 rows fill a last wave and the Hopper kernels split them over the keys when the split is
on): the Hopper wgmma kernels -- int8-fp8 and INT4 (block_n 128 and 64), head_dim 64 and 128 -- dense and under a
block map with empty, single-block, short and full rows and a row that keeps only blocks past kv_lens, each with
and without the tail split; the mma.sync kernels (int8-fp8 ``mma`` on sm89+, INT4 ``s8``), dense and sparse. Each
output is checked finite (rows that keep nothing are 0). On a GPU without the Hopper kernels (not sm90) their
calls are left out, and said so.

Each tool runs ``compute-sanitizer --tool T --kernel-name kns=rotvid`` (the rotvid kernels only: torch's own
kernels are not under test; ``--all-kernels`` checks them too) over ``--calls`` in a child process -- except
initcheck, which instruments every kernel: under the filter torch's kernels' writes are not seen, so each rotvid read
of memory a torch kernel wrote (kv_lens, made int32 by ``.to``) is reported uninitialised (44,769 reports on two
calls, H200, none with every kernel instrumented; ``--rotvid-kernels-only`` gives that run). Its full log
goes to ``DIR/sanitize_T.log`` and one line per tool is printed and written to ``DIR/sanitize.md``:

    racecheck   rc 0   0 hazards (0 errors, 0 warnings)    calls 40   sanitize_racecheck.log

The exit status is 1 when a tool reports an error or a hazard or its run fails, else 0. ``$COMPUTE_SANITIZER``
names the binary (default: ``compute-sanitizer`` on PATH, else ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOOLS = ("racecheck", "initcheck", "synccheck", "memcheck")
N, KV_LEN = 600, 500


def _map(device):
    """A BlockMap for 600 queries and keys (Tq = Tk = 5): rows empty, one block, short (two), full, and one that
    keeps only block 4, wholly past kv_lens 500."""
    import torch

    from rotvid.kernels.sparsity import BlockMap

    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[1, 2] = True                      # one block
    mask[2, [0, 3]] = True                 # short, with the block kv_lens cuts (3: keys 384..511)
    mask[3] = True                         # full
    mask[4, 4] = True                      # only past kv_lens (row 0 stays empty)
    return BlockMap.from_mask(mask.to(device), n_q=N, n_kv=N)


def run_calls(match: str | None = None) -> int:
    """Every call once (``match``: only those whose name the regular expression finds); prints one line per call and
    ``calls N``; exit status 1 if an output is not finite."""
    import torch

    from rotvid.kernels.hadamard_op import vo_hadamard_cuda
    from rotvid.kernels.recipes.int4.ops import attention_int4_quantized, preprocess_int4_cuda
    from rotvid.kernels.recipes.int8_fp8.ops import attention_int8fp8_quantized, preprocess_int8fp8_cuda

    cap = torch.cuda.get_device_capability()
    hopper = cap[0] == 9
    kv_lens = torch.tensor([KV_LEN], device="cuda")
    bm = _map("cuda")
    bad = calls = 0

    def inputs(d, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return [torch.randn(1, 1, N, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3)]

    def wanted(name):
        return match is None or re.search(match, name) is not None

    def check(name, out):
        nonlocal bad, calls
        torch.cuda.synchronize()
        calls += 1
        ok = bool(torch.isfinite(out).all())
        bad += not ok
        print(f"{'ok ' if ok else 'NON-FINITE'} {name}", flush=True)

    if not hopper:
        print(f"sm{cap[0]}{cap[1]}: no Hopper wgmma kernels here; their calls are left out", flush=True)
    for d in (64, 128):
        q, k, v = inputs(d, d)
        if cap >= (8, 9):
            kq = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens)
            paths = ([("wgmma", True), ("wgmma", False)] if hopper else []) + [("mma", False)]
            for path, split in paths:
                for name, m in (("dense", None), ("sparse", bm)):
                    if not wanted(f"int8-fp8 {path} d{d} {name} split={split}"):
                        continue
                    out = attention_int8fp8_quantized(kq, n_q=N, n_kv=N, head_dim=d, kv_lens=kv_lens, path=path,
                                                      split_tail=split, block_map=m)
                    check(f"int8-fp8 {path} d{d} {name} split={split}", out)
            # the online V/O Hadamard: V rotated in the pre-processing (V_HADAMARD, V smoothed and not), the output
            # turned back in the kernel's epilogue (o_hadamard: whole tiles and the split combine, dense and sparse,
            # both kernels), and the separate O pass (hadamard_rows) over a rotated output
            for smooth_v in (False, True):
                name = f"int8-fp8 online-vo d{d} smooth_v={smooth_v}"
                if cap >= (8, 9) and wanted(name):
                    kq = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, smooth_v=smooth_v, v_hadamard=True)
                    out = attention_int8fp8_quantized(kq, n_q=N, n_kv=N, head_dim=d, kv_lens=kv_lens,
                                                      path="wgmma" if hopper else "mma")
                    check(name, vo_hadamard_cuda(out, d, side="o"))
                    for path in (("wgmma", "mma") if hopper else ("mma",)):
                        for split in ((True, False) if path == "wgmma" else (False,)):
                            for mname, m in (("dense", None), ("sparse", bm)):
                                out = attention_int8fp8_quantized(kq, n_q=N, n_kv=N, head_dim=d, kv_lens=kv_lens,
                                                                  path=path, split_tail=split, block_map=m,
                                                                  o_hadamard=True)
                                check(f"{name} epilogue {path} {mname} split={split}", out)
        int4 = [("wgmma", bn, split) for bn in (128, 64) for split in (True, False)] if hopper else []
        int4 += [("s8", 64, False)]
        for path, block_n, split in int4:
            if not any(wanted(f"int4 {path} bn{block_n} d{d} {name} split={split}") for name in ("dense", "sparse")):
                continue
            kq = preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n, path=path, smooth_q=True)
            for name, m in (("dense", None), ("sparse", bm)):
                if not wanted(f"int4 {path} bn{block_n} d{d} {name} split={split}"):
                    continue
                out = attention_int4_quantized(kq, n_q=N, n_kv=N, head_dim=d, block_n=block_n, kv_lens=kv_lens,
                                               path=path, split_tail=split, block_map=m)
                check(f"int4 {path} bn{block_n} d{d} {name} split={split}", out)
    print(f"calls {calls}, non-finite {bad}", flush=True)
    return 1 if bad else 0


_RACE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_CALLS = re.compile(r"^calls (\d+), non-finite (\d+)", re.M)


def summarize(tool: str, rc: int, log: str) -> tuple[str, bool]:
    """One line for a tool's run (its return code and log) and whether it is clean."""
    calls = _CALLS.search(log)
    calls_txt = f"calls {calls.group(1)} (non-finite {calls.group(2)})" if calls else "calls did not finish"
    clean = rc == 0 and calls is not None and calls.group(2) == "0"
    race = _RACE.search(log)
    errors = _ERRORS.search(log)
    if race:
        found = f"{race.group(1)} hazards ({race.group(2)} errors, {race.group(3)} warnings)"
        clean = clean and race.group(1) == "0"
    elif errors:
        found = f"{errors.group(1)} errors"
        clean = clean and errors.group(1) == "0"
    else:
        found = "no summary in the log"
        clean = False
    return f"{tool:<10} rc {rc:<3} {found:<40} {calls_txt}", clean


def tool_command(sanitizer: str, tool: str, args) -> list[str]:
    """The sanitizer command of one tool over ``--calls`` (initcheck over every kernel unless told otherwise)."""
    cmd = [sanitizer, "--tool", tool, "--print-limit", "200"]
    if args.rotvid_kernels_only or not (args.all_kernels or tool == "initcheck"):
        cmd += ["--kernel-name", "kns=rotvid"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
    cmd += [sys.executable, "-m", "benchmarks.sanitize_calls", "--calls"]
    if args.match is not None:
        cmd += ["--match", args.match]
    return cmd


def find_sanitizer() -> str:
    explicit = os.environ.get("COMPUTE_SANITIZER")
    if explicit:
        return explicit
    for cand in (shutil.which("compute-sanitizer"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer"),
                 "/usr/local/cuda/bin/compute-sanitizer"):
        if cand and os.path.isfile(cand):
            return cand
    raise SystemExit("sanitize_calls: compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin; "
                     "or set COMPUTE_SANITIZER)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", action="store_true", help="run the calls only (the sanitized child)")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    ap.add_argument("--out", type=Path, default=Path("out"), help="folder for the logs and sanitize.md")
    ap.add_argument("--all-kernels", action="store_true",
                    help="sanitize torch's kernels too under every tool (default: rotvid's, initcheck every kernel)")
    ap.add_argument("--rotvid-kernels-only", action="store_true",
                    help="initcheck too instruments rotvid's kernels only (reports the reads of what torch wrote)")
    ap.add_argument("--match", default=None,
                    help="only the calls whose name this regular expression finds (e.g. 'd64'; names: --calls)")
    args = ap.parse_args(argv)
    if args.all_kernels and args.rotvid_kernels_only:
        ap.error("--all-kernels and --rotvid-kernels-only: one or the other")
    if args.match is not None:
        try:
            re.compile(args.match)
        except re.error as e:
            ap.error(f"--match: not a regular expression ({e})")
    if args.calls:
        return run_calls(args.match)
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        ap.error(f"--tools: unknown {unknown}; expected some of {', '.join(TOOLS)}")
    sanitizer = find_sanitizer()
    args.out.mkdir(parents=True, exist_ok=True)
    lines, status = [], 0
    for tool in tools:
        cmd = tool_command(sanitizer, tool, args)
        run = subprocess.run(cmd, capture_output=True, text=True)
        log = run.stdout + run.stderr
        log_path = args.out / f"sanitize_{tool}.log"
        log_path.write_text(" ".join(cmd) + "\n" + log)
        line, clean = summarize(tool, run.returncode, log)
        line += f"   {log_path.name}"
        print(line, flush=True)
        lines.append(line)
        status |= 0 if clean else 1
    (args.out / "sanitize.md").write_text("```\n" + "\n".join(lines) + "\n```\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
