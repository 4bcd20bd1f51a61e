"""``TokenGrid``: where a video's tokens sit in an attention sequence (what a static map is built from)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TokenGrid"]


@dataclass(frozen=True)
class TokenGrid:
    """A self-attention sequence of ``prefix`` conditioning tokens, then the video tokens of a (frames, height,
    width) grid *after patchifying*, ordered frame-major (token ``prefix + (f * height + y) * width + x``), then
    ``suffix`` conditioning tokens.

    Conditioning tokens are the ones every video token may need: HunyuanVideo's text tokens (a suffix, after the
    video tokens), CogVideoX's text tokens (a prefix), Wan2.x I2V's first (image) frame given as ``prefix =
    height * width`` with ``frames`` the remaining ones.
    """

    frames: int
    height: int
    width: int
    prefix: int = 0
    suffix: int = 0

    def __post_init__(self) -> None:
        for name in ("frames", "height", "width"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"grid: {name} must be a positive int (tokens after patchifying), got {val!r}")
        for name in ("prefix", "suffix"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise ValueError(f"grid: {name} must be an int >= 0 (conditioning tokens), got {val!r}")

    @property
    def frame_tokens(self) -> int:
        """Tokens per frame (height * width)."""
        return self.height * self.width

    @property
    def video_tokens(self) -> int:
        return self.frames * self.frame_tokens

    @property
    def num_tokens(self) -> int:
        """The sequence length: prefix + video + suffix."""
        return self.prefix + self.video_tokens + self.suffix
