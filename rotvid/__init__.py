"""rotvid: INT4 self-attention with RoPE-aware rotations for video diffusion transformers."""

__version__ = "0.1.0"
