"""Attention statistics: bounds, and the trained proxy's rows are more peaked than random weights'."""

import torch

from rotvid.pipelines.proxy.measure import main


def test_trained_attention_is_more_peaked_than_random(tmp_path):
    result = main(["attention", "--height", "64", "--frames", "9", "--sigmas", "0.5", "--device", "cpu",
                   "--json", str(tmp_path / "a.json")])
    rows = result["rows"]["0.5"]
    trained, random = rows["trained"], rows["random"]
    assert len(trained) == len(random) == 6
    for r in trained + random:
        assert r["tokens"] == 3 * 4 * 4  # 9 frames -> 3 latent frames; 64 px -> 8 latent -> 4 patches
        assert 0 < r["entropy_ratio"] <= 1 and 0 < r["max_prob"] <= 1
        assert 0 < r["window_share"] <= 1 and 0 < r["local_mass"] <= 1 + 1e-6
    mean = lambda rs: sum(r["entropy_ratio"] for r in rs) / len(rs)  # noqa: E731
    assert mean(trained) < mean(random) - 0.05, (mean(trained), mean(random))
    assert (tmp_path / "a.json").is_file() and torch.isfinite(torch.tensor(mean(trained)))
