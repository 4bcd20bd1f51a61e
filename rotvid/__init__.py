"""rotvid: low-precision self-attention with RoPE-aware rotations for video diffusion transformers.

    import rotvid

    pipe = rotvid.load_pipeline("wan2.2-t2v-a14b", dtype="bf16", device="cuda")
    handle = rotvid.apply(pipe, rotvid.RotvidConfig())  # recipe "auto": this GPU's
    ...
    rotvid.remove(pipe)

    out = rotvid.attention(q, k, v)  # one call, this device's recipe

The names are imported on first use (``import rotvid`` alone stays light: the CLI's start-up reads only
``__version__``).
"""

__version__ = "0.2.0"

__all__ = ["RotvidConfig", "__version__", "apply", "attention", "load_pipeline", "remove"]

_EXPORTS = {
    "apply": "rotvid.pipelines.attach",
    "remove": "rotvid.pipelines.attach",
    "RotvidConfig": "rotvid.pipelines.config",
    "load_pipeline": "rotvid.pipelines.loading",
    "attention": "rotvid.api",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rotvid' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
