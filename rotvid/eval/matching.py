"""Pairing reference and candidate videos: file against files, or folder against folders by name.

- ``REFERENCE`` a file: every candidate must be a file; each is compared with the reference.
  The variant label of a candidate is its file stem.
- ``REFERENCE`` a folder: every candidate must be a folder; videos are matched by file name.
  Each candidate folder must hold exactly the reference folder's video names (a video missing on
  either side is an error naming it: a silently partial comparison would bias the averages).
  The variant label of a candidate is its folder name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rotvid.eval.video_io import list_videos


@dataclass(frozen=True)
class VideoPair:
    """One comparison: ``name`` identifies the video (its file stem) within its variant."""

    name: str
    reference: Path
    candidate: Path


@dataclass(frozen=True)
class CandidateSet:
    """All pairs of one candidate (file or folder), labelled ``variant``."""

    variant: str
    source: Path
    pairs: tuple[VideoPair, ...]


def _unique_labels(paths: Sequence[Path], label) -> list[str]:
    labels = [label(p) for p in paths]
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        if labels.count(lab) > 1:
            seen[lab] = seen.get(lab, 0) + 1
            out.append(f"{lab}#{seen[lab]}")
        else:
            out.append(lab)
    return out


def match_videos(reference: str | os.PathLike, candidates: Sequence[str | os.PathLike]) -> list[CandidateSet]:
    """Pair ``reference`` with each of ``candidates`` (see the module doc for the rules).

    Raises ``FileNotFoundError`` for a path that does not exist and ``ValueError`` for a mix of
    files and folders, an empty reference folder, or videos that do not match by name.
    """
    ref = Path(reference)
    if not candidates:
        raise ValueError("CANDIDATE: expected at least one candidate video or folder")
    cands = [Path(c) for c in candidates]
    for p, arg in [(ref, "REFERENCE")] + [(c, "CANDIDATE") for c in cands]:
        if not p.exists():
            raise FileNotFoundError(f"{arg} {p} does not exist")
    if ref.is_file():
        for c in cands:
            if not c.is_file():
                raise ValueError(f"CANDIDATE {c}: the reference is a file, so each candidate must be a video file")
        labels = _unique_labels(cands, lambda p: p.stem)
        return [
            CandidateSet(variant=lab, source=c, pairs=(VideoPair(name=ref.stem, reference=ref, candidate=c),))
            for lab, c in zip(labels, cands)
        ]
    ref_videos = list_videos(ref)
    if not ref_videos:
        raise ValueError(f"REFERENCE {ref} holds no .mp4 videos")
    ref_names = {p.name: p for p in ref_videos}
    labels = _unique_labels(cands, lambda p: p.resolve().name)
    out = []
    for lab, c in zip(labels, cands):
        if not c.is_dir():
            raise ValueError(f"CANDIDATE {c}: the reference is a folder, so each candidate must be a folder of videos")
        cand_names = {p.name: p for p in list_videos(c)}
        missing = sorted(set(ref_names) - set(cand_names))
        extra = sorted(set(cand_names) - set(ref_names))
        if missing:
            raise ValueError(f"CANDIDATE {c} lacks {len(missing)} of the reference's videos: {', '.join(missing)}")
        if extra:
            raise ValueError(f"CANDIDATE {c} has {len(extra)} videos the reference lacks: {', '.join(extra)}")
        pairs = tuple(
            VideoPair(name=Path(n).stem, reference=ref_names[n], candidate=cand_names[n]) for n in sorted(ref_names)
        )
        out.append(CandidateSet(variant=lab, source=c, pairs=pairs))
    return out
