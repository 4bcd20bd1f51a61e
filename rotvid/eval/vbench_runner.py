"""VBench dimensions through VBench's own Python environment, as a subprocess.

The ``vbench`` package pins ``transformers==4.33.2`` and ``numpy<2``, which cannot share an
environment with current diffusers, so rotvid never imports it: it runs
``rotvid/eval/vbench_driver.py`` with the VBench environment's interpreter on a folder of videos
(VBench's ``custom_input`` mode, prompts passed per file) and reads back a JSON of scores.

Create that environment once (the command ``rotvid vbench-setup`` runs the same steps)::

    python3 -m venv ~/.cache/rotvid/vbench-venv
    ~/.cache/rotvid/vbench-venv/bin/pip install torch torchvision vbench==0.1.5

(torch and torchvision from the same index, so that torchvision's compiled ops match torch.)

Model weights are never downloaded by rotvid: VBench runs with ``local=True`` and every file a
dimension needs must already be under ``VBENCH_CACHE_DIR`` (default ``~/.cache/vbench``). A
dimension whose files are missing fails before VBench starts, with the list of files to download
and where to put them. ``temporal_flickering`` needs no weights at all.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_VENV = Path.home() / ".cache" / "rotvid" / "vbench-venv"
VBENCH_PACKAGE = "vbench==0.1.5"
DRIVER = Path(__file__).with_name("vbench_driver.py")

# VBench dimensions that its custom_input mode accepts (the others need VBench's own prompts).
CUSTOM_INPUT_DIMENSIONS = (
    "subject_consistency",
    "background_consistency",
    "temporal_flickering",
    "motion_smoothness",
    "dynamic_degree",
    "aesthetic_quality",
    "imaging_quality",
    "temporal_style",
    "overall_consistency",
    "human_action",
)
STANDARD_ONLY_DIMENSIONS = ("object_class", "multiple_objects", "color", "spatial_relationship", "scene", "appearance_style")

_CLIP = "https://openaipublic.azureedge.net/clip/models"
_HF = "https://huggingface.co/OpenGVLab/VBench_Used_Models/resolve/main"
# What VBench 0.1.5 loads from VBENCH_CACHE_DIR with local=True, per dimension: (path, source).
VBENCH_WEIGHTS: dict[str, tuple[tuple[str, str], ...]] = {
    "temporal_flickering": (),
    "subject_consistency": (
        ("dino_model/facebookresearch_dino_main/", "git clone https://github.com/facebookresearch/dino"),
        ("dino_model/dino_vitbase16_pretrain.pth",
         "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"),
    ),
    "background_consistency": (
        ("clip_model/ViT-B-32.pt", f"{_CLIP}/40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af/ViT-B-32.pt"),
    ),
    "aesthetic_quality": (
        ("clip_model/ViT-L-14.pt", f"{_CLIP}/b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836/ViT-L-14.pt"),
        ("aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth",
         "https://github.com/LAION-AI/aesthetic-predictor/blob/main/sa_0_4_vit_l_14_linear.pth?raw=true"),
    ),
    "imaging_quality": (
        ("pyiqa_model/musiq_spaq_ckpt-358bb6af.pth",
         "https://github.com/chaofengc/IQA-PyTorch/releases/download/v0.1-weights/musiq_spaq_ckpt-358bb6af.pth"),
    ),
    "motion_smoothness": (("amt_model/amt-s.pth", "https://huggingface.co/lalala125/AMT/resolve/main/amt-s.pth"),),
    "dynamic_degree": (
        ("raft_model/models/raft-things.pth", "models.zip of RAFT (https://github.com/princeton-vl/RAFT), unzipped"),
    ),
    "human_action": (
        ("umt_model/l16_ptk710_ftk710_ftk400_f16_res224.pth", f"{_HF}/l16_ptk710_ftk710_ftk400_f16_res224.pth"),
    ),
    "temporal_style": (
        ("ViCLIP/ViClip-InternVid-10M-FLT.pth", f"{_HF}/ViClip-InternVid-10M-FLT.pth"),
        ("ViCLIP/bpe_simple_vocab_16e6.txt.gz",
         "https://raw.githubusercontent.com/openai/CLIP/main/clip/bpe_simple_vocab_16e6.txt.gz"),
    ),
    "overall_consistency": (
        ("ViCLIP/ViClip-InternVid-10M-FLT.pth", f"{_HF}/ViClip-InternVid-10M-FLT.pth"),
        ("ViCLIP/bpe_simple_vocab_16e6.txt.gz",
         "https://raw.githubusercontent.com/openai/CLIP/main/clip/bpe_simple_vocab_16e6.txt.gz"),
    ),
}


class VBenchError(RuntimeError):
    """VBench cannot run (environment, weights) or failed; the message says what to do."""


@dataclass
class VBenchScores:
    """Scores of one folder: ``dimensions[dim] = {"mean": float, "videos": {file name: float}}``."""

    dimensions: dict[str, dict]
    vbench_version: str = "unknown"
    device: str = "unknown"
    log: str = field(default="", repr=False)

    def means(self) -> dict[str, float]:
        return {d: float(v["mean"]) for d, v in self.dimensions.items()}


def vbench_cache_dir() -> Path:
    """``$VBENCH_CACHE_DIR``, or VBench's own default ``~/.cache/vbench``."""
    env = os.environ.get("VBENCH_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "vbench"


def parse_dimensions(text: str) -> list[str]:
    """Parse ``--vbench DIM,...``; ``ValueError`` for an unknown or standard-prompt-only dimension."""
    dims = [d.strip() for d in text.split(",") if d.strip()]
    if not dims:
        raise ValueError(f"--vbench: expected one or more of {', '.join(CUSTOM_INPUT_DIMENSIONS)}")
    for d in dims:
        if d in STANDARD_ONLY_DIMENSIONS:
            raise ValueError(
                f"--vbench: {d} needs VBench's own prompt suite and cannot score custom prompts; "
                f"choose from {', '.join(CUSTOM_INPUT_DIMENSIONS)}"
            )
        if d not in CUSTOM_INPUT_DIMENSIONS:
            raise ValueError(f"--vbench: unknown dimension {d!r}; expected one of {', '.join(CUSTOM_INPUT_DIMENSIONS)}")
    return list(dict.fromkeys(dims))


def missing_weights(dimensions: list[str], cache_dir: Path | None = None) -> list[tuple[str, str, str]]:
    """(dimension, path under the cache, where to get it) for every needed file that is absent."""
    cache = Path(cache_dir) if cache_dir is not None else vbench_cache_dir()
    out = []
    for dim in dimensions:
        for rel, source in VBENCH_WEIGHTS[dim]:
            p = cache / rel
            present = p.is_dir() if rel.endswith("/") else p.is_file()
            if not present:
                out.append((dim, rel, source))
    return out


def check_weights(dimensions: list[str], cache_dir: Path | None = None) -> None:
    """Raise :class:`VBenchError` listing every missing weight file (and where to get it)."""
    cache = Path(cache_dir) if cache_dir is not None else vbench_cache_dir()
    missing = missing_weights(dimensions, cache)
    if missing:
        dims = sorted({m[0] for m in missing})
        items = "; ".join(f"{cache / rel} <- {src}" for _, rel, src in missing)
        raise VBenchError(
            f"VBench weights missing in VBENCH_CACHE_DIR={cache} for {', '.join(dims)}: download {items}"
        )


def resolve_vbench_python(path: str | os.PathLike | None) -> Path:
    """The VBench environment's interpreter: ``path``, else ``$ROTVID_VBENCH_PYTHON``, else the
    environment made by ``rotvid vbench-setup``. Raises :class:`VBenchError` saying how to make one."""
    candidate = path or os.environ.get("ROTVID_VBENCH_PYTHON") or (DEFAULT_VENV / "bin" / "python")
    p = Path(candidate).expanduser()
    if not p.is_file() or not os.access(p, os.X_OK):
        how = (
            f"create one with `rotvid vbench-setup` (or: python3 -m venv {DEFAULT_VENV} && "
            f"{DEFAULT_VENV}/bin/pip install torch torchvision {VBENCH_PACKAGE}) and pass --vbench-python"
        )
        given = "--vbench-python" if path else ("ROTVID_VBENCH_PYTHON" if os.environ.get("ROTVID_VBENCH_PYTHON") else "default")
        raise VBenchError(f"VBench Python {p} ({given}) is not an executable file; {how}")
    return p


def setup_commands(venv: Path) -> list[list[str]]:
    """The commands that create a VBench environment at ``venv``."""
    py = str(Path(venv) / "bin" / "python")
    return [
        [sys.executable, "-m", "venv", str(venv)],
        [py, "-m", "pip", "install", "torch", "torchvision", VBENCH_PACKAGE],
    ]


def run_vbench(
    python: str | os.PathLike,
    videos: str | os.PathLike,
    prompts: dict[str, str],
    dimensions: list[str],
    *,
    device: str = "auto",
    cache_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
) -> VBenchScores:
    """Score the ``.mp4`` files of folder ``videos`` on ``dimensions`` with VBench.

    ``prompts`` maps each video file name (e.g. ``"000-a-cat.mp4"``) to its prompt. The weight
    files are checked first (:func:`check_weights`). Raises :class:`VBenchError` with VBench's
    last output lines when the subprocess fails.
    """
    cache = Path(cache_dir) if cache_dir is not None else vbench_cache_dir()
    check_weights(dimensions, cache)
    videos = Path(videos)
    names = sorted(p.name for p in videos.glob("*.mp4") if not p.name.startswith("."))
    if not names:
        raise VBenchError(f"VBench: no .mp4 videos in {videos}")
    missing = [n for n in names if n not in prompts]
    if missing:
        raise VBenchError(f"VBench: no prompt for {', '.join(missing)}")
    env = dict(os.environ)
    env["VBENCH_CACHE_DIR"] = str(cache)
    with tempfile.TemporaryDirectory(prefix="rotvid-vbench-") as tmp:
        tmp = Path(tmp)
        prompt_file, result = tmp / "prompts.json", tmp / "scores.json"
        prompt_file.write_text(json.dumps({n: prompts[n] for n in names}, ensure_ascii=False), encoding="utf-8")
        cmd = [str(python), str(DRIVER), "--videos", str(videos), "--prompts", str(prompt_file),
               "--dimensions", ",".join(dimensions), "--work", str(tmp / "work"), "--result", str(result),
               "--device", device]
        logger.info("running VBench: %s", " ".join(cmd))
        try:
            proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise VBenchError(f"VBench did not finish within {timeout} s") from None
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if ln.strip()), "")
            raise VBenchError(f"VBench failed (exit {proc.returncode}): {first}" + _tail(proc.stderr))
        data = json.loads(result.read_text(encoding="utf-8"))
    return VBenchScores(dimensions=data["dimensions"], vbench_version=data.get("vbench_version", "unknown"),
                        device=data.get("device", "unknown"), log=log)


def _tail(text: str, n: int = 5) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "" if len(lines) <= 1 else " | last lines: " + " / ".join(lines[-n:])
