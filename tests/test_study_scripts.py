"""The study scripts' host side: sanitize_calls' commands and summaries, kernel_variants' settings, call_overhead's
rows."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import call_overhead, kernel_variants, sanitize_calls
from rotvid.kernels import dispatch


def _args(**kw):
    base = dict(all_kernels=False, rotvid_kernels_only=False, match=None)
    return argparse.Namespace(**{**base, **kw})


def test_initcheck_instruments_every_kernel_the_others_rotvids_only():
    init = sanitize_calls.tool_command("cs", "initcheck", _args())
    race = sanitize_calls.tool_command("cs", "racecheck", _args(match="d64"))
    assert "kns=rotvid" not in init
    assert race[race.index("--kernel-name") + 1] == "kns=rotvid"
    assert race[-2:] == ["--match", "d64"] and "--racecheck-report" in race
    assert init[-3:] == ["-m", "benchmarks.sanitize_calls", "--calls"]  # the child: this module, run as one
    assert "kns=rotvid" in sanitize_calls.tool_command("cs", "initcheck", _args(rotvid_kernels_only=True))
    assert "kns=rotvid" not in sanitize_calls.tool_command("cs", "memcheck", _args(all_kernels=True))


def test_summaries_read_the_logs():
    log = "ok x\ncalls 32, non-finite 0\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    line, clean = sanitize_calls.summarize("racecheck", 0, log)
    assert clean and "0 hazards" in line and "calls 32" in line
    bad = log.replace("0 hazards displayed (0 errors", "200 hazards displayed (77625 errors")
    assert not sanitize_calls.summarize("racecheck", 0, bad)[1]
    assert not sanitize_calls.summarize("initcheck", 0, "calls 2, non-finite 0\nERROR SUMMARY: 3 errors\n")[1]
    assert not sanitize_calls.summarize("memcheck", 0, "ERROR SUMMARY: 0 errors\n")[1]  # the calls did not finish


@pytest.mark.parametrize("argv, needle", [
    (["--match", "("], "--match: not a regular expression"),
    (["--all-kernels", "--rotvid-kernels-only"], "one or the other"),
    (["--tools", "racecheck,helgrind"], "unknown ['helgrind']"),
])
def test_bad_arguments_stop_before_any_run(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        sanitize_calls.main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_variant_settings_and_their_flags():
    ok = ("table", "3,0,1", "def:ROTVID_HOPPER_RELEASE=1", "def:ROTVID_HOPPER_RELEASE=0+ROTVID_HOPPER_STAGES=4")
    for setting in ok:
        assert kernel_variants.SCHEDULE.match(setting), setting
    for setting in ("3,3,1", "def:HOPPER=1", "def:ROTVID_X=1;rm", "def:"):
        assert not kernel_variants.SCHEDULE.match(setting), setting
    assert kernel_variants.flags_for("table") is None
    assert kernel_variants.flags_for("3,2,1") == ("-DROTVID_HOPPER_STAGES=3 -DROTVID_HOPPER_PINGPONG=2 "
                                                  "-DROTVID_HOPPER_PIPE=1")
    assert kernel_variants.flags_for("def:ROTVID_A=1+ROTVID_B=x") == "-DROTVID_A=1 -DROTVID_B=x"
    assert kernel_variants.cache_for("def:ROTVID_HOPPER_RELEASE=1").name == "hopper-schedule-def-ROTVID_HOPPER_RELEASE-1"


def test_call_overhead_rows_and_the_backends_left_as_they_were(tmp_path):
    before = dict(dispatch._BACKENDS)
    out = tmp_path / "overhead.json"
    assert call_overhead.main(["--calls", "2", "--rounds", "1", "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    names = {(r["row"], r["recipe"]) for r in rows}
    for recipe in call_overhead.RECIPES:
        for row in ("attention() [null backend]", "run_attention [null backend]", "processor [null backend]",
                    "processor [reference]"):
            assert (row, recipe) in names
    assert all(r["us"] > 0 for r in rows)
    assert dispatch._BACKENDS == before  # the null backend gone, the reference back
    with pytest.raises(SystemExit):
        call_overhead.main(["--calls", "0"])


def test_a_recorded_command_leaves_out_where_the_run_wrote():
    """Output paths are a machine's folders, not how to repeat a run (tests/test_repo_paths.py refuses them)."""
    from benchmarks.study_io import command_line

    got = command_line("x", ["--rounds", "3", "--json-out", "out/a.json", "--markdown-out=out/b.md", "--append",
                             "out/c.md", "--tiny", "--prompt", "a red cat"])
    assert got == "python -m benchmarks.x --rounds 3 --tiny --prompt 'a red cat'"
