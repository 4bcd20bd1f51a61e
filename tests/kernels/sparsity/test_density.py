"""Maps at a chosen density: radial's window and top-p's tau matched to a target density, checked against the maps
the builders make (the density a study reports is the one its maps have) and against a scan of every parameter."""

import pytest
import torch

from rotvid.kernels.sparsity import TokenGrid, build_block_map
from rotvid.kernels.sparsity.density import radial_density, radial_for_density, topp_density, topp_tau_for_density
from rotvid.kernels.sparsity.topp import topp_estimate, topp_keep
from tests.kernels.sparsity.test_topp import clustered


def _map_density(spec, q, k, grid=None) -> float:
    return float(build_block_map(spec, q, k, grid=grid).block_map.density())


@pytest.mark.parametrize("grid, bands", [(TokenGrid(9, 8, 16), (1,)), (TokenGrid(7, 12, 10), (0,)),
                                         (TokenGrid(5, 8, 8), (1,)), (TokenGrid(9, 8, 16), (1, 0, 2, 3))])
@pytest.mark.parametrize("target", [0.3, 0.5, 0.7])
def test_radial_spec_is_the_closest_and_its_density_is_the_maps(grid, bands, target):
    spec, got = radial_for_density(grid, target, bands=bands)
    assert spec.kind == "radial" and spec.options["band"] in bands
    q = torch.zeros(1, 1, grid.num_tokens, 8)
    assert got == pytest.approx(_map_density(spec, q, q, grid), abs=1e-7)  # what the builder's map keeps
    windows = range(max(grid.height, grid.width) + 1)
    every = {(b, w): radial_density(grid, band=b, window=w) for b in bands for w in windows}
    for b in bands:  # the density grows with the window
        assert all(every[b, w] <= every[b, w + 1] for w in windows[:-1])
    closest = min(abs(d - target) for d in every.values())
    assert abs(got - target) == pytest.approx(closest)
    first = next(key for key, d in every.items() if abs(d - target) == abs(got - target))  # (bands, then windows)
    assert (spec.options["band"], spec.options["window"]) == first


def test_radial_targets_outside_the_reachable_range_get_the_ends():
    grid = TokenGrid(9, 8, 16)
    low, d_low = radial_for_density(grid, 0.01)
    assert low.options["window"] == 0 and d_low == radial_density(grid, window=0) > 0.01
    high, d_high = radial_for_density(grid, 1.0)
    assert d_high == radial_density(grid) and high.options["window"] <= 16


def test_topp_keep_is_the_estimates_rule_at_any_tau_and_sim():
    q, k = clustered(2, 2, 900, 32, seed=7)
    kv_lens = torch.tensor([900, 500])
    base = topp_estimate(q, k, tau=0.9, kv_lens=kv_lens)
    for tau, sim in ((0.3, 0.5), (0.7, -1.0), (0.99, 0.8)):
        other = topp_estimate(q, k, tau=tau, sim=sim, kv_lens=kv_lens)
        assert torch.equal(topp_keep(base.mass, base.q_sim, base.k_sim, base.k_live, tau=tau, sim=sim), other.keep)


def _calls(n=4, seed=10, tokens=1100):
    return [clustered(1, 2, tokens, 32, seed=seed + i, noise=0.6, scale=1.0) for i in range(n)]


@pytest.mark.parametrize("target", [0.3, 0.5, 0.7])
def test_topp_tau_gives_the_calls_maps_the_density_it_says_and_the_closest(target):
    calls = _calls()
    estimates = [topp_estimate(q, k, tau=1.0) for q, k in calls]
    tau, got = topp_tau_for_density(estimates, target, resolution=1e-3)
    built = sum(_map_density(f"topp:{tau}", q, k) for q, k in calls) / len(calls)
    assert got == pytest.approx(built, abs=1e-6)  # the maps the builder makes at that tau
    assert got == pytest.approx(topp_density(estimates, tau), abs=1e-12)
    grid = [topp_density(estimates, i / 1000) for i in range(1, 1001)]
    assert all(a <= b + 1e-12 for a, b in zip(grid, grid[1:]))  # the density grows with tau
    assert abs(got - target) == pytest.approx(min(abs(d - target) for d in grid), abs=1e-12)
    assert abs(got - target) < 0.1  # these calls' maps have densities near every target


def test_topp_density_weighs_each_call_once_whatever_its_shape():
    small, large = _calls(1, seed=20, tokens=300), _calls(1, seed=21, tokens=1100)
    est = [topp_estimate(q, k, tau=1.0) for q, k in small + large]
    each = [topp_density([e], 0.6) for e in est]
    assert topp_density(est, 0.6) == pytest.approx(sum(each) / 2)


def test_topp_targets_outside_the_reachable_range():
    estimates = [topp_estimate(q, k, tau=1.0) for q, k in _calls(2)]
    tau, got = topp_tau_for_density(estimates, 1.0)
    assert tau == 1.0 and got == topp_density(estimates, 1.0)
    tau, got = topp_tau_for_density(estimates, 1e-6, resolution=0.01)
    assert tau == 0.01 and got == topp_density(estimates, 0.01) > 1e-6  # the diagonal is always kept


@pytest.mark.parametrize("call, message", [
    (lambda e: topp_tau_for_density(e, 0.0), "density"),
    (lambda e: topp_tau_for_density(e, 1.5), "density"),
    (lambda e: topp_tau_for_density(e, True), "density"),
    (lambda e: topp_tau_for_density([], 0.5), "estimates"),
    (lambda e: topp_tau_for_density(e, 0.5, resolution=0), "resolution"),
    (lambda e: topp_density([(1, 2)], 0.5), "estimates"),
    (lambda e: radial_for_density(TokenGrid(2, 4, 4), -0.1), "density"),
    (lambda e: radial_for_density(TokenGrid(2, 4, 4), 0.5, bands=()), "bands"),
    (lambda e: radial_for_density(TokenGrid(2, 4, 4), 0.5, bands=(-1,)), "bands"),
])
def test_bad_arguments_are_errors(call, message):
    estimates = [topp_estimate(*_calls(1)[0], tau=1.0)]
    with pytest.raises(ValueError, match=message):
        call(estimates)


@pytest.mark.parametrize("target", [0.3, 0.5, 0.7])
def test_pmin_gives_the_calls_maps_the_density_it_says_and_the_closest(target):
    """The ``pmin`` threshold matched on the same estimates: the builder's maps at that threshold have the density it
    reports, the density falls as the threshold grows, and the chosen one is the grid's closest."""
    from rotvid.kernels.sparsity.density import pmin_for_density

    calls = _calls()
    estimates = [topp_estimate(q, k, tau=1.0) for q, k in calls]
    pmin, got = pmin_for_density(estimates, target, steps_per_decade=50)
    built = sum(_map_density(f"pmin:{pmin}", q, k) for q, k in calls) / len(calls)
    assert got == pytest.approx(built, abs=1e-6)
    grid = [float(f"{1e-6 * 10 ** (i / 50):.4g}") for i in range(301)] + [1.0]
    dens = [_pmin_density(estimates, p) for p in grid]
    assert all(a >= b - 1e-12 for a, b in zip(dens, dens[1:]))  # (the density falls as the threshold grows)
    assert abs(got - target) == pytest.approx(min(abs(d - target) for d in dens), abs=1e-12)
    assert abs(got - target) < 0.1


def _pmin_density(estimates, pmin):
    from rotvid.kernels.sparsity.density import _mean_density, _stacked

    return _mean_density(_stacked(estimates), pmin, 0.5, kind="pmin")


def test_pmin_arguments_are_checked():
    from rotvid.kernels.sparsity.density import pmin_for_density

    estimates = [topp_estimate(q, k, tau=1.0) for q, k in _calls(1)]
    for kwargs, message in [(dict(density=0.0), "density"), (dict(density=0.5, lowest=0.0), "lowest"),
                            (dict(density=0.5, steps_per_decade=0), "steps_per_decade")]:
        with pytest.raises(ValueError, match=message):
            pmin_for_density(estimates, **kwargs)
    with pytest.raises(ValueError, match="estimates"):
        pmin_for_density([], 0.5)
