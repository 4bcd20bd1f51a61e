import math

import pytest
import torch

from rotvid.kernels import metrics


def test_known_values():
    ref = torch.tensor([3.0, 4.0])
    x = torch.tensor([3.0, 5.0])
    assert metrics.relative_l2(ref, x) == pytest.approx(1 / 5)
    assert metrics.sqnr_db(ref, x) == pytest.approx(10 * math.log10(25 / 1))
    assert metrics.max_abs_error(ref, x) == pytest.approx(1.0)
    assert metrics.cosine_similarity(ref, x) == pytest.approx((9 + 20) / (5 * math.sqrt(34)))


def test_identical_and_opposite():
    a = torch.randn(100)
    assert metrics.sqnr_db(a, a) == math.inf and metrics.relative_l2(a, a) == 0
    assert metrics.cosine_similarity(a, -a) == pytest.approx(-1.0)


def test_shape_mismatch_names_the_argument():
    with pytest.raises(ValueError, match="x: expected shape"):
        metrics.cosine_similarity(torch.zeros(3), torch.zeros(4))
