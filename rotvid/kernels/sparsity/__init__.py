"""Block-sparse attention maps: which key blocks each query tile visits, and where maps come from.

=========  =======  ===========================================================================================
kind       when     what it keeps
=========  =======  ===========================================================================================
``none``   --       every key block (no map; the default)
``radial`` static   dense within a temporal band, spatial windows halving as the temporal distance doubles
                    (Radial Attention's energy-decay rule), conditioning tokens both ways; from the token grid
``topp``   per call the key blocks holding ``tau`` of each query tile's estimated mass (block means), blocks that
                    are not self-similar, the diagonal
``pmin``   per call the key blocks whose estimated share of their query tile's mass is at least ``pmin`` (the same
                    estimate; one threshold for every row), each row's largest, ``topp``'s always-kept blocks
``oracle`` per call evaluation only: the key blocks of highest *exact* attention mass (full-precision scores), a
                    fraction ``density`` of the valid key blocks per query tile -- the best map at that density
=========  =======  ===========================================================================================

:class:`BlockMap` is the map every attention path takes (``block_map=`` of :func:`rotvid.kernels.attention`);
:class:`SparsitySpec` / :func:`parse_sparsity` name a kind and its parameters (``none``, ``radial:band=1``,
``topp:0.9,sim=0.5``); :func:`build_block_map` builds a call's map. Add a kind: write its module (a
:class:`SparsityKind` with its parameters and builder) and register it -- here for a built-in one, or with
:func:`register_sparsity_kind` from anywhere. :mod:`rotvid.kernels.sparsity.density` matches the kinds whose density is
not their parameter to a density (radial's band and window from the grid, top-p's tau and pmin's threshold from some
calls' estimates), so that kinds are compared at equal density; :mod:`rotvid.kernels.sparsity.cost` estimates the
block-sparse kernel's time at a density (a line fitted to its measured times).
"""

from __future__ import annotations

from rotvid.kernels.sparsity import oracle, radial, topp
from rotvid.kernels.sparsity.block_map import MAP_BLOCK, BlockMap
from rotvid.kernels.sparsity.grid import TokenGrid
from rotvid.kernels.sparsity.spec import (
    NONE,
    SparseMap,
    SparsityKind,
    SparsitySpec,
    build_block_map,
    get_sparsity_kind,
    parse_sparsity,
    register_sparsity_kind,
    sparsity_kind_names,
    unregister_sparsity_kind,
)

__all__ = [
    "MAP_BLOCK", "BlockMap", "SparseMap", "SparsityKind", "SparsitySpec", "TokenGrid", "build_block_map",
    "get_sparsity_kind", "parse_sparsity", "register_sparsity_kind", "sparsity_kind_names",
    "unregister_sparsity_kind",
]

# The built-in kinds (one line each; the order is the order of every listing).
register_sparsity_kind(NONE)
register_sparsity_kind(radial.KIND)
register_sparsity_kind(topp.KIND)
register_sparsity_kind(topp.PMIN_KIND)
register_sparsity_kind(oracle.KIND)
