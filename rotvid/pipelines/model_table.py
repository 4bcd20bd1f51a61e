"""The model table: the registered families' facts and checkpoints, as the rest of rotvid reads them.

The facts themselves live in one module per family, :mod:`rotvid.pipelines.families` (``wan.py``,
``hunyuan_video.py``, ...), and nowhere else; this module keeps the names the pipelines, the CLI and the tests have
always read, over the same registry objects:

* :data:`FAMILIES` (name -> :class:`~rotvid.pipelines.families.base.Family`, also called ``ModelFamily``),
  :data:`MODELS` (friendly short name -> :class:`~rotvid.pipelines.families.base.ModelEntry`) and
  :data:`PIPELINE_REQUIREMENTS` (pipeline class -> packages it calls unconditionally): the registry's own dicts;
* :func:`family_of_transformer`, :func:`family_by_name`, :func:`model_entry`, :func:`frame_rate`;
* :data:`DEFAULT_MODEL`, the checkpoint ``rotvid`` runs when none is named, and :data:`PROXY_FOLDER`, the folder of
  the model bundled with rotvid (``proxy``).
"""

from __future__ import annotations

from rotvid.pipelines.families import FAMILIES, MODELS, PIPELINE_REQUIREMENTS, family_by_name
from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry

__all__ = [
    "BlockStack",
    "ModelFamily",
    "ModelEntry",
    "FAMILIES",
    "MODELS",
    "DEFAULT_MODEL",
    "PROXY_FOLDER",
    "PIPELINE_REQUIREMENTS",
    "family_of_transformer",
    "family_by_name",
    "model_entry",
    "frame_rate",
]

ModelFamily = Family  # its name before the families became modules

DEFAULT_MODEL = "wan2.1-t2v-1.3b"

# The proxy model's folder inside the package (rotvid/pipelines/proxy/weights).
PROXY_FOLDER = MODELS["proxy"].repo_id


def family_of_transformer(transformer) -> Family:
    """The family whose ``transformer_classes`` contains ``type(transformer).__name__``.

    Raises:
        ValueError: the transformer is not one rotvid supports.
    """
    cls = type(transformer).__name__
    for fam in FAMILIES.values():
        if cls in fam.transformer_classes:
            return fam
    known = sorted(c for f in FAMILIES.values() for c in f.transformer_classes)
    raise ValueError(f"pipe: expected a transformer of class {', '.join(known)}, got {cls}")


def model_entry(repo_id: str) -> ModelEntry | None:
    """The :data:`MODELS` entry whose ``repo_id`` is ``repo_id`` (exact), or ``None``."""
    for entry in MODELS.values():
        if entry.repo_id == repo_id:
            return entry
    return None


def frame_rate(family: str, repo_id: str | None = None) -> int:
    """Frames per second of ``family``'s videos, or of the checkpoint ``repo_id`` where it has its own.

    Args:
        family: a key of :data:`FAMILIES`.
        repo_id: a diffusers repo id (``None`` or an unknown one: the family's rate).

    Raises:
        ValueError: unknown family, or ``repo_id`` is a known checkpoint of another family.
    """
    fam = family_by_name(family)
    entry = model_entry(repo_id) if repo_id is not None else None
    if entry is None:
        return fam.fps
    if entry.family != fam.name:
        raise ValueError(f"repo_id: {repo_id!r} is a {entry.family} checkpoint, not {fam.name}")
    return entry.fps if entry.fps is not None else fam.fps
