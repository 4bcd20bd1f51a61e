"""No file of the package, the tests, CI, the benchmarks, the docs or the project metadata cites a path outside the
repository (a path on someone's machine: a home folder, a scratch or work area), in code, comments or docs alike.

Paths a program makes at run time (``tempfile``, pytest's ``tmp_path``) are not written in the files, so they are
not seen here; this file's own pattern is built from pieces so that it does not match itself.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("rotvid", "tests", ".ci", "benchmarks", "pyproject.toml", "README.md", "CHANGELOG.md")
# The top folders of _DIRS after a slash not preceded by a name character, a dot, a dash or a slash (so a relative
# "a/<dir>/b" and a URL's path "https://host/<dir>/x" are not taken for absolute paths of a machine).
_DIRS = "|".join(("wo" + "rk", "ro" + "ot", "ho" + "me", "tm" + "p", "Us" + "ers", "mn" + "t"))
OUTSIDE = re.compile(r"(?<![\w./-])/(?:" + _DIRS + r")/")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True, check=True)
        names = [n for n in out.stdout.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): walk the folders
        names = [str(p.relative_to(ROOT)) for s in SCANNED for p in ([ROOT / s] if (ROOT / s).is_file()
                 else (ROOT / s).rglob("*")) if p.is_file()]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def hits(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file
        return []
    return [f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}"
            for i, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def test_no_path_outside_the_repository():
    files = tracked_files()
    assert any(f.parts[-2:] == ("cli", "__init__.py") for f in files) and any(f.suffix == ".cuh" for f in files)
    found = [h for f in files for h in hits(f)]
    assert found == [], "\n".join(found)


def test_the_pattern_finds_what_it_should():
    tmp, home = "/" + "tm" + "p/", "/" + "ho" + "me/"
    assert OUTSIDE.search(f"// numerics: {tmp}notes.md") and OUTSIDE.search(f"see {home}me/x.py")
    assert OUTSIDE.search(f'rotation="learned:{tmp}r.safetensors"')
    assert not OUTSIDE.search("rotvid/kernels/csrc/x.cuh") and not OUTSIDE.search("https://example.org/home/page")
    assert not OUTSIDE.search("benchmarks/tmp/out.json")
