"""CPU: which CUDA compiler the extension loader picks and what it says, with stand-in folders. Each fake ``nvcc`` is a
shell script that prints a release; PATH, CUDA_HOME and CUDA_PATH are cleared, sys.path and /usr/local/cuda are
replaced, torch's CUDA and the driver's version are patched. Nothing here runs a real nvcc."""

import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rotvid.cli import app
from rotvid.kernels import cuda_build, cuda_sources, cuda_toolkit


def fake_nvcc(home: Path, version: str) -> Path:
    """``home/bin/nvcc``: prints ``release MAJOR.MINOR, VFULL`` and, on a dry run, its bin folder as nvcc does."""
    major_minor = ".".join(version.split(".")[:2])
    nvcc = home / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True, exist_ok=True)
    nvcc.write_text("#!/bin/sh\n"
                    'case "$1" in --dryrun) echo "#\\$ _HERE_=$(cd "$(dirname "$0")" && pwd)" >&2 ;;\n'
                    f'  *) echo "Cuda compilation tools, release {major_minor}, V{version}" ;; esac\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return nvcc


def pip_tree(site: Path, version: str, folder: str = "cu13", runtime: bool = True) -> Path:
    """A pip-installed toolkit folder as ``cuda-toolkit[nvcc,cccl]`` lays it out: site/nvidia/cu13/{bin,include,lib}."""
    home = site / "nvidia" / folder
    nvcc = fake_nvcc(home, version)
    (home / "include" / "crt").mkdir(parents=True)
    (home / "include" / "cccl").mkdir()
    (home / "nvvm" / "libdevice").mkdir(parents=True)
    if runtime:
        (home / "include" / "cuda_runtime.h").write_text("")
        (home / "lib").mkdir()
        (home / "lib" / f"libcudart.so.{version.split('.')[0]}").write_text("")
    return nvcc


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A machine with no compiler anywhere: PATH holds only sh and friends, no CUDA_HOME, an empty sys.path for the
    pip search, /usr/local/cuda somewhere empty; torch built for CUDA 13.0, the driver CUDA 13.0."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for tool in ("sh", "dirname", "cat"):
        found = next((Path(d) / tool for d in ("/bin", "/usr/bin") if (Path(d) / tool).exists()), None)
        if found is not None:
            (bare / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bare))
    for var in ("CUDA_HOME", "CUDA_PATH", cuda_toolkit.ENV, "ROTVID_EXT_CUDA_FLAGS"):
        monkeypatch.delenv(var, raising=False)
    sites: list[Path] = []
    monkeypatch.setattr(cuda_toolkit, "_site_roots", lambda: list(sites))
    monkeypatch.setattr(cuda_toolkit, "SYSTEM_ROOT", tmp_path / "usr-local-cuda")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    driver = {"version": (13, 0)}
    monkeypatch.setattr(cuda_toolkit, "driver_cuda_version", lambda: driver["version"])
    monkeypatch.setenv("ROTVID_EXT_CACHE", str(tmp_path / "ext"))
    cuda_toolkit.clear_cache()

    class Machine:
        root = tmp_path

        def site(self, name="site-packages") -> Path:
            path = tmp_path / name
            path.mkdir(exist_ok=True)
            sites.append(path)
            return path

        def driver(self, version):
            driver["version"] = version

    yield Machine()
    cuda_toolkit.clear_cache()


# ---- which compiler ---------------------------------------------------------------------------


def test_the_pip_compiler_is_found_without_cuda_home_or_a_system_toolkit(machine):
    nvcc = pip_tree(machine.site(), "13.0.88")
    tk = cuda_toolkit.find_toolkit()
    assert (tk.nvcc, tk.version, tk.source, tk.home) == (nvcc, "13.0.88", "pip", nvcc.parent.parent)
    assert tk.release == (13, 0) and tk.include_dirs == ()
    assert tk.cudart == tk.home / "lib" / "libcudart.so.13"
    assert cuda_build._nvcc() == str(nvcc)
    assert tk.describe() == f"nvcc 13.0.88 at {nvcc} (pip package)"


def test_search_order_env_then_pip_then_cuda_home_then_path_then_usr_local(machine, monkeypatch, tmp_path):
    default = fake_nvcc(cuda_toolkit.SYSTEM_ROOT, "13.0.48")
    assert cuda_toolkit.find_toolkit().source == "default"
    on_path = fake_nvcc(tmp_path / "path-cuda", "13.0.50")
    monkeypatch.setenv("PATH", f"{on_path.parent}:{os.environ['PATH']}")
    cuda_toolkit.clear_cache()
    assert cuda_toolkit.find_toolkit().nvcc == on_path
    home = tmp_path / "cuda-home"
    fake_nvcc(home, "13.0.60")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert cuda_toolkit.find_toolkit().source == "CUDA_HOME"
    pip = pip_tree(machine.site(), "13.0.88")
    cuda_toolkit.clear_cache()
    assert cuda_toolkit.find_toolkit().nvcc == pip
    explicit = fake_nvcc(tmp_path / "mine", "13.1.20")
    monkeypatch.setenv(cuda_toolkit.ENV, str(explicit.parent.parent))  # a toolkit folder
    assert (cuda_toolkit.find_toolkit().nvcc, cuda_toolkit.find_toolkit().source) == (explicit, "ROTVID_NVCC")
    monkeypatch.setenv(cuda_toolkit.ENV, "system")
    assert cuda_toolkit.find_toolkit().source == "CUDA_HOME"
    monkeypatch.setenv(cuda_toolkit.ENV, "pip")
    assert cuda_toolkit.find_toolkit().nvcc == pip
    assert [s for _, s in cuda_toolkit.candidates()] == ["pip"]
    assert default.exists()


def test_rotvid_nvcc_pip_hides_the_system_toolkit(machine):
    fake_nvcc(cuda_toolkit.SYSTEM_ROOT, "13.0.88")
    os.environ[cuda_toolkit.ENV] = "pip"
    try:
        with pytest.raises(RuntimeError, match=r"no pip-installed nvcc on sys.path .*pip install 'rotvid\[cuda\]'"):
            cuda_toolkit.find_toolkit()
    finally:
        del os.environ[cuda_toolkit.ENV]


def test_rotvid_nvcc_naming_nothing_is_an_error(machine, monkeypatch, tmp_path):
    monkeypatch.setenv(cuda_toolkit.ENV, str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match=r"ROTVID_NVCC=.*nowhere: no nvcc there"):
        cuda_toolkit.find_toolkit()


def test_no_compiler_anywhere_names_every_place_looked(machine):
    with pytest.raises(RuntimeError) as err:
        cuda_toolkit.find_toolkit()
    msg = str(err.value)
    assert "none pip-installed, none in CUDA_HOME, on PATH or in" in msg and "rotvid[cuda]" in msg


def test_a_wrapper_on_path_finds_its_real_toolkit(machine, monkeypatch, tmp_path):
    """/usr/local/bin/nvcc is often a two-line script: the home is where nvcc.profile's _HERE_ says, not above it."""
    real = fake_nvcc(tmp_path / "cuda-13.0", "13.0.88")
    wrapper = tmp_path / "local-bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    tk = cuda_toolkit.find_toolkit()
    assert tk.nvcc == wrapper and tk.home == tmp_path / "cuda-13.0" and tk.source == "PATH"


def test_headers_and_cudart_from_torch_s_runtime_wheel_in_another_folder(machine):
    """rotvid's compiler packages installed into one folder, torch's nvidia-cuda-runtime in another."""
    torch_site = machine.site("torch-site")
    runtime = torch_site / "nvidia" / "cu13"
    (runtime / "include" / "cccl").mkdir(parents=True)
    (runtime / "include" / "cuda_runtime.h").write_text("")
    (runtime / "lib").mkdir()
    (runtime / "lib" / "libcudart.so.13").write_text("")
    pip_tree(machine.site("target"), "13.0.88", runtime=False)
    tk = cuda_toolkit.find_toolkit()
    assert tk.include_dirs == (runtime / "include",) and tk.cudart == runtime / "lib" / "libcudart.so.13"


def test_link_folder_gives_cudart_an_unversioned_name(machine):
    pip_tree(machine.site(), "13.0.88")
    tk = cuda_toolkit.find_toolkit()
    (flag,) = cuda_build._link_dirs(tk)
    link = Path(flag[2:]) / "libcudart.so"
    assert flag.startswith("-L") and link.is_symlink() and os.readlink(link) == str(tk.cudart)
    assert cuda_build._link_dirs(tk) == [flag]  # made once


# ---- does it fit torch and the driver ---------------------------------------------------------


@pytest.mark.parametrize("nvcc_version,torch_cuda,fragments", [
    ("12.8.93", "13.0", ("nvcc 12.8.93", "is CUDA 12.8", "built for CUDA 13.0", "major versions differ")),
    ("13.0.88", "13.2", ("nvcc 13.0.88", "is CUDA 13.0", "older than torch", "CUDA 13.2")),
    ("13.0.88", "12.9", ("is CUDA 13.0", "built for CUDA 12.9", "major versions differ")),
])
def test_a_compiler_that_does_not_fit_torch_names_both_versions(machine, monkeypatch, nvcc_version, torch_cuda,
                                                               fragments):
    pip_tree(machine.site(), nvcc_version, folder=f"cu{nvcc_version.split('.')[0]}")
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    with pytest.raises(RuntimeError) as err:
        cuda_toolkit.find_toolkit()
    msg = str(err.value)
    assert msg.startswith("rotvid CUDA kernels: no CUDA compiler fits: ") and "\n" not in msg
    for f in fragments:
        assert f in msg, msg


def test_a_newer_minor_than_torch_fits(machine, monkeypatch):
    pip_tree(machine.site(), "13.2.51")
    machine.driver((13, 2))
    assert cuda_toolkit.find_toolkit().version == "13.2.51"


def test_the_first_compiler_that_fits_wins_and_the_others_are_passed_over(machine, monkeypatch):
    pip_tree(machine.site(), "12.8.93", folder="cu12")  # a stale CUDA 12 compiler first
    system = fake_nvcc(cuda_toolkit.SYSTEM_ROOT, "13.0.88")
    assert cuda_toolkit.find_toolkit().nvcc == system


def test_a_driver_older_than_the_compiler_s_major_is_refused_before_any_compile(machine, monkeypatch):
    pip_tree(machine.site(), "13.0.88")
    machine.driver((12, 8))
    called = []
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda *a, **k: called.append(1))
    with pytest.raises(RuntimeError, match=r"nvcc 13\.0\.88 .*is CUDA 13\.0, the driver supports CUDA 12\.8 only"):
        cuda_build._build((9, 0))
    assert called == []


def test_an_older_driver_minor_runs_sass_but_not_ptx(machine, monkeypatch):
    pip_tree(machine.site(), "13.2.51")
    machine.driver((13, 0))
    assert cuda_toolkit.find_toolkit().version == "13.2.51"  # SASS only: minor-version compatibility
    monkeypatch.setenv("ROTVID_EXT_CUDA_FLAGS", "-gencode=arch=compute_90a,code=compute_90a")
    assert cuda_build._embeds_ptx()
    with pytest.raises(RuntimeError, match=r"CUDA 13\.2, the driver supports CUDA 13\.0 only: too old to JIT its PTX"):
        cuda_build._nvcc()


def test_device_problem_carries_the_mismatch(machine, monkeypatch):
    pip_tree(machine.site(), "12.8.93", folder="cu12")
    monkeypatch.setattr(cuda_build, "arch_entry", lambda device=None: cuda_build.ARCH_TABLE[(9, 0)])
    problem = cuda_build.device_problem(0)
    assert "nvcc 12.8.93" in problem and "CUDA 13.0" in problem


# ---- the build: what it says and records ------------------------------------------------------


def test_the_first_build_says_so_with_the_last_build_s_duration_and_records_its_own(machine, monkeypatch, caplog):
    pip_tree(machine.site(), "13.0.88")
    seen = {}

    def fake_load(name, build_directory, extra_ldflags, extra_include_paths, sources, extra_cuda_cflags, **kw):
        from torch.utils import cpp_extension

        seen.update(home=cpp_extension.CUDA_HOME, ldflags=extra_ldflags, includes=extra_include_paths,
                    sources=sources, cuda_flags=extra_cuda_cflags)
        Path(build_directory, f"{name}.so").write_text("")
        return "module"

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    from torch.utils import cpp_extension

    before = cpp_extension.CUDA_HOME
    caplog.set_level("INFO", logger=cuda_build.__name__)
    module, name, folder, seconds, tk = cuda_build._build((9, 0))
    assert module == "module" and seconds is not None and folder == cuda_build.cache_dir() / name
    assert seen["home"] == str(tk.home) and cpp_extension.CUDA_HOME == before  # set for the build only
    assert seen["ldflags"][0].startswith("-L") and seen["includes"] == [str(cuda_build.CSRC)]  # (no toolkit folders)
    assert seen["sources"] == [str(p) for p in cuda_sources.find_sources().sources]  # found by folder
    assert "-gencode=arch=compute_90a,code=sm_90a" in seen["cuda_flags"]
    first = [r.getMessage() for r in caplog.records if r.getMessage().startswith("building")]
    assert len(first) == 1 and "a first build takes about a minute" in first[0] and str(folder) in first[0]
    assert "nvcc 13.0.88" in first[0] and "rotvid build" in first[0]
    record = cuda_build.last_build()
    assert record["extension"] == name and record["arch"] == "sm90" and record["nvcc_version"] == "13.0.88"
    assert (folder / "build.json").is_file()

    # built already: no announcement; another extension (new sources) names the last build's time
    caplog.clear()
    assert cuda_build._build((9, 0))[3] is None
    assert not [r for r in caplog.records if r.getMessage().startswith("building")]
    cuda_build._build((8, 9))
    msg = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("building"))
    assert f"the last build took {record['seconds']:.0f} s" in msg


def test_the_cache_key_follows_the_compiler(machine):
    a = cuda_toolkit.Toolkit(nvcc=Path("/a/nvcc"), version="13.0.88", source="pip", home=Path("/a"))
    b = cuda_toolkit.Toolkit(nvcc=Path("/b/nvcc"), version="13.2.51", source="pip", home=Path("/b"))
    assert cuda_build.extension_name((9, 0), a) != cuda_build.extension_name((9, 0), b)


@pytest.mark.parametrize("text,cap", [("sm_90a", (9, 0)), ("sm90", (9, 0)), ("8.9", (8, 9)), ("SM86", (8, 6))])
def test_parse_arch(text, cap):
    assert cuda_build.parse_arch(text) == cap


@pytest.mark.parametrize("text", ["sm75", "sm_100a", "hopper", ""])
def test_parse_arch_refuses_what_the_table_lacks(text):
    with pytest.raises(ValueError, match=r"--arch: expected one of sm80, sm86, sm87, sm89, sm90"):
        cuda_build.parse_arch(text)


# ---- the command line ---------------------------------------------------------------------------

runner = CliRunner()


def one_error_line(result, *fragments):
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "Traceback" not in result.output


def test_build_without_a_gpu_is_one_clear_error(machine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_error_line(runner.invoke(app, ["build"]), "no CUDA GPU on this machine", "--arch")


def test_build_for_a_named_arch_with_a_cpu_torch_is_one_clear_error(machine, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    one_error_line(runner.invoke(app, ["build", "--arch", "sm90a"]), "is a CPU build")


def test_build_with_a_compiler_that_does_not_fit_stops_before_compiling(machine, monkeypatch):
    pip_tree(machine.site(), "12.8.93", folder="cu12")
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda *a, **k: pytest.fail("compiled"))
    one_error_line(runner.invoke(app, ["build", "--arch", "sm90a"]), "nvcc 12.8.93", "CUDA 13.0")


def test_build_refuses_an_unknown_arch_and_bad_jobs(machine):
    one_error_line(runner.invoke(app, ["build", "--arch", "sm75"]), "--arch: expected one of")
    one_error_line(runner.invoke(app, ["build", "--jobs", "0"]), "--jobs")


def test_build_for_a_named_arch_shows_the_compiler_and_records_the_build(machine, monkeypatch):
    pip_tree(machine.site(), "13.0.88")

    def fake_load(name, build_directory, **kw):
        Path(build_directory, f"{name}.o").write_text("")
        Path(build_directory, f"{name}.so").write_text("")
        return "module"

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    monkeypatch.setenv("MAX_JOBS", "1")  # put back after the command sets it
    r = runner.invoke(app, ["build", "--arch", "sm_90a", "--jobs", "3"])
    assert r.exit_code == 0, r.output
    assert "compiler: nvcc 13.0.88 at" in r.stdout and "(pip package)" in r.stdout
    assert "built rotvid_cuda_sm90_" in r.stdout and str(cuda_build.cache_dir()) in r.stdout
    assert f"building rotvid_cuda_sm90_" in r.stderr and f"into {cuda_build.cache_dir()}" in r.stderr
    assert "building the sm90 kernels" in r.stderr  # the progress display
    assert cuda_build.last_build()["jobs"] == "3"
    again = runner.invoke(app, ["build", "--arch", "sm90"])
    assert again.exit_code == 0 and "up to date" in again.stdout and "the last build took" in again.stdout


def test_backends_prints_the_compiler_line(machine):
    nvcc = pip_tree(machine.site(), "13.0.88")
    r = runner.invoke(app, ["backends"])
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("compiler")]
    assert f"nvcc 13.0.88 at {nvcc} (pip package)" in line and "torch CUDA 13.0" in line
    assert "driver CUDA 13.0" in line


def test_backends_names_the_mismatch(machine, monkeypatch):
    pip_tree(machine.site(), "13.0.88")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    r = runner.invoke(app, ["backends"])
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("compiler")]
    assert "nvcc 13.0.88" in line and "CUDA 12.8" in line and "major versions differ" in line


def test_backends_without_any_compiler_says_where_it_looked(machine):
    r = runner.invoke(app, ["backends"])
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("compiler")]
    assert "no nvcc" in line and "rotvid[cuda]" in line


def test_the_real_search_reads_sys_path():
    assert cuda_toolkit._site_roots() == [Path(p) for p in sys.path if p and os.path.isdir(p)]
