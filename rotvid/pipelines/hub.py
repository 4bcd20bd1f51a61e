"""What to tell a user whose model is on the Hugging Face Hub when the hub cannot be reached.

Shared by :mod:`rotvid.pipelines.pipeline_config` (the config files, read before any weight loads) and
:mod:`rotvid.pipelines.loading` (the weights).
"""

from __future__ import annotations

__all__ = ["HubUnreachableError", "hub_unreachable_message"]


class HubUnreachableError(OSError):
    """A hub model that is neither reachable nor in the local Hugging Face cache."""


def hub_unreachable_message(model: str, repo_id: str, cause: BaseException | str) -> str:
    """What to do when ``repo_id`` cannot be fetched: a local folder, or the offline cache."""
    from huggingface_hub import constants

    from rotvid.pipelines.model_table import MODELS

    text = " ".join(str(cause).split())
    if ("not fully cached" in text or "outgoing traffic has been disabled" in text or "connect" in text.lower()
            or "offline" in text.lower() or "cannot find an appropriate cached" in text.lower()):
        why = "it is not in the local cache and the Hugging Face Hub cannot be reached"
    else:
        why = text
    proxy = " (or --model proxy, the bundled small model, to try rotvid without a download)" \
        if "proxy" in MODELS else ""
    return (f"model {model!r} ({repo_id}) cannot be loaded: {why}. Offline: pass --model FOLDER, a local pipeline "
            f"folder with a model_index.json (e.g. written by save_pretrained){proxy}; or download it once online "
            f"and run with HF_HUB_OFFLINE=1 (the cache: $HF_HOME/hub, here {constants.HF_HUB_CACHE})")
