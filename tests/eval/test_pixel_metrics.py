import math

import numpy as np
import pytest

from rotvid.eval import pixel_metrics as pm

C1 = (0.01 * 255) ** 2  # SSIM stabilizer for data_range 255


def test_identical_video_gives_inf_psnr_ssim_one_cosine_one():
    v = np.random.default_rng(0).integers(0, 256, (3, 24, 40, 3), dtype=np.uint8)
    m = pm.compare_arrays(v, v.copy())
    assert m.psnr == math.inf and m.mse == 0.0
    assert m.ssim == pytest.approx(1.0, abs=1e-12)
    assert m.cosine == pytest.approx(1.0, abs=1e-12)
    assert m.psnr_per_frame == [math.inf] * 3
    assert (m.frames, m.height, m.width) == (3, 24, 40)


def test_plus_minus_three_noise_gives_mse_nine():
    rng = np.random.default_rng(1)
    ref = rng.integers(10, 246, (4, 16, 24, 3), dtype=np.uint8)
    sign = rng.choice(np.array([-3, 3]), size=ref.shape)
    cand = (ref.astype(int) + sign).astype(np.uint8)
    m = pm.compare_arrays(ref, cand)
    assert m.mse == pytest.approx(9.0, rel=0, abs=1e-12)
    assert m.psnr == pytest.approx(10 * math.log10(255**2 / 9.0), abs=1e-9)
    assert m.psnr_per_frame == pytest.approx([10 * math.log10(255**2 / 9.0)] * 4, abs=1e-9)
    r, c = ref.astype(np.float64).ravel(), cand.astype(np.float64).ravel()
    assert m.cosine == pytest.approx(r @ c / np.sqrt((r @ r) * (c @ c)), rel=1e-12)


def test_constant_frames_have_closed_form_ssim_and_per_frame_psnr():
    """Flat frames: σ = 0, so SSIM = (2·μr·μc + C1) / (μr² + μc² + C1) exactly."""
    rng = np.random.default_rng(2)
    levels_r = rng.integers(40, 200, size=3)
    offsets = np.array([0, 5, 20])
    ref = np.stack([np.full((16, 16, 3), lv, np.uint8) for lv in levels_r])
    cand = np.stack([np.full((16, 16, 3), lv + d, np.uint8) for lv, d in zip(levels_r, offsets)])
    m = pm.compare_arrays(ref, cand)
    ssim = [(2 * a * (a + d) + C1) / (a * a + (a + d) ** 2 + C1) for a, d in zip(levels_r.astype(float), offsets)]
    assert m.ssim == pytest.approx(np.mean(ssim), rel=1e-9)
    assert m.psnr_per_frame[0] == math.inf
    assert m.psnr_per_frame[1:] == pytest.approx([10 * math.log10(255**2 / 25), 10 * math.log10(255**2 / 400)])
    assert m.mse == pytest.approx((0 + 25 + 400) / 3)
    assert m.psnr == pytest.approx(10 * math.log10(255**2 / ((25 + 400) / 3)))


def test_cosine_edge_cases():
    black = np.zeros((2, 8, 8, 3), np.uint8)
    grey = np.full((2, 8, 8, 3), 7, np.uint8)
    assert pm.compare_arrays(black, black).cosine == 1.0
    assert pm.compare_arrays(black, grey).cosine == 0.0
    assert pm.compare_arrays(grey, grey * 3).cosine == pytest.approx(1.0)


def test_mismatches_are_named():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="has 2 frames, the reference has 3"):
        pm.compare_arrays(a, a[:2])
    with pytest.raises(ValueError, match="has 4 frames, the reference has 3"):
        pm.compare_arrays(a, np.concatenate([a, a[:1]]))
    with pytest.raises(ValueError, match="size 8x16"):
        pm.compare_arrays(a, a[:, :, :8])
    with pytest.raises(ValueError, match="candidate: expected an RGB uint8 video"):
        pm.compare_arrays(a, a.astype(np.float32))


def test_psnr_from_mse_and_json_inf():
    assert pm.psnr_from_mse(0.0) == math.inf
    assert pm.psnr_from_mse(255.0**2) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="mse"):
        pm.psnr_from_mse(-1.0)
    assert pm.float_to_json(math.inf) == "inf" and pm.float_from_json("inf") == math.inf
    assert pm.float_to_json(3.5) == 3.5


def test_mean_metrics_keeps_inf():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    b = a.copy()
    b[0, 0, 0, 0] ^= 1
    ms = [pm.compare_arrays(a, a), pm.compare_arrays(a, b)]
    mean = pm.mean_metrics(ms)
    assert mean["psnr"] == math.inf
    assert mean["mse"] == pytest.approx(ms[1].mse / 2)
