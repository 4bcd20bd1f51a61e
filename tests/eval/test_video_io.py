from fractions import Fraction

import numpy as np
import pytest
import torch

from rotvid.eval import video_io


def smooth_video(rng, frames=6, h=48, w=64):
    """A smooth moving gradient (compresses well, so decoding stays close to the input)."""
    y, x = np.mgrid[0:h, 0:w]
    phase = rng.uniform(0, 2 * np.pi, size=3)
    out = np.empty((frames, h, w, 3), np.uint8)
    for f in range(frames):
        for c in range(3):
            out[f, :, :, c] = (127 + 100 * np.sin(x / 25.0 + y / 31.0 + phase[c] + 0.3 * f)).astype(np.uint8)
    return out


def test_round_trip_frames_size_fps(tmp_path):
    rng = np.random.default_rng(1)
    video = smooth_video(rng, frames=7, h=48, w=64)
    path = video_io.write_video(tmp_path / "a.mp4", video, 16)
    info = video_io.probe_video(path)
    assert (info.frames, info.height, info.width, info.fps) == (7, 48, 64, Fraction(16))
    back, fps = video_io.read_video(path)
    assert back.shape == video.shape and back.dtype == np.uint8 and fps == 16
    # H.264 (crf 18, yuv420p) on a smooth video: close, not bit-exact
    assert np.abs(back.astype(int) - video.astype(int)).mean() < 3.0  # 4:2:0 chroma, YUV rounding
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]  # no temporary left


def test_float_and_torch_inputs(tmp_path):
    rng = np.random.default_rng(2)
    video = smooth_video(rng, frames=3, h=32, w=32)
    as_float = video.astype(np.float32) / 255.0
    assert np.array_equal(video_io.to_uint8_frames(as_float), video)
    t = torch.from_numpy(as_float).permute(0, 3, 1, 2)  # [F, 3, H, W]
    assert np.array_equal(video_io.to_uint8_frames(t), video)
    video_io.write_video(tmp_path / "f.mp4", as_float, Fraction(24000, 1001))
    assert video_io.probe_video(tmp_path / "f.mp4").fps == Fraction(24000, 1001)


def test_no_overwrite_without_flag(tmp_path):
    rng = np.random.default_rng(3)
    video = smooth_video(rng, frames=2, h=16, w=16)
    p = video_io.write_video(tmp_path / "a.mp4", video, 8)
    before = p.read_bytes()
    with pytest.raises(FileExistsError, match="--overwrite"):
        video_io.write_video(p, video[::-1].copy(), 8)
    assert p.read_bytes() == before
    video_io.write_video(p, smooth_video(rng, frames=3, h=16, w=16), 8, overwrite=True)
    assert video_io.probe_video(p).frames == 3


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """An encoder failure midway leaves neither the final file nor the temporary one."""
    import av

    rng = np.random.default_rng(4)
    video = smooth_video(rng, frames=4, h=16, w=16)
    calls = {"n": 0}
    original = av.VideoFrame.from_ndarray

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(av.VideoFrame, "from_ndarray", failing)
    with pytest.raises(KeyboardInterrupt):
        video_io.write_video(tmp_path / "a.mp4", video, 8)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "frames, match",
    [
        (np.zeros((2, 16, 16), np.uint8), r"shape \[F, H, W, 3\]"),
        (np.zeros((0, 16, 16, 3), np.uint8), "at least one frame"),
        (np.zeros((2, 15, 16, 3), np.uint8), "even height and width"),
        (np.zeros((2, 16, 16, 3), np.int32), "dtype int32"),
        (np.full((2, 16, 16, 3), np.nan, np.float32), "finite"),
    ],
)
def test_bad_frames(tmp_path, frames, match):
    with pytest.raises(ValueError, match=match):
        video_io.write_video(tmp_path / "a.mp4", frames, 8)
    assert list(tmp_path.iterdir()) == []


def test_bad_path_fps_crf(tmp_path):
    v = np.random.default_rng(5).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="path: expected a file name ending in .mp4"):
        video_io.write_video(tmp_path / "a.avi", v, 8)
    with pytest.raises(ValueError, match="fps"):
        video_io.write_video(tmp_path / "a.mp4", v, 0)
    with pytest.raises(ValueError, match="crf"):
        video_io.write_video(tmp_path / "a.mp4", v, 8, crf=60)
    for fps in (float("nan"), float("inf"), "8"):
        with pytest.raises(ValueError, match="fps: expected a positive, finite frame rate"):
            video_io.write_video(tmp_path / "a.mp4", v, fps)
    with pytest.raises(ValueError, match="crf"):
        video_io.write_video(tmp_path / "a.mp4", v, 8, crf=51.9)  # (was truncated to 51)
    assert video_io.write_video(tmp_path / "a.mp4", v, np.float32(8.0), crf=np.int64(20)).is_file()  # numpy scalars


def test_reading_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        video_io.probe_video(tmp_path / "missing.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(np.random.default_rng(6).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match="cannot be read as a video"):
        video_io.probe_video(junk)
    with pytest.raises(ValueError, match="expected a file"):
        video_io.probe_video(tmp_path)


def test_list_videos_skips_partial_and_other_files(tmp_path):
    v = np.random.default_rng(7).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    video_io.write_video(tmp_path / "b.mp4", v, 8)
    video_io.write_video(tmp_path / "a.mp4", v, 8)
    (tmp_path / ".c.partial-1.mp4").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in video_io.list_videos(tmp_path)] == ["a.mp4", "b.mp4"]
