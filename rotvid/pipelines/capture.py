"""Calibration observers on the self-attention calls of a pipeline rotvid is applied to.

Both are registered on ``handle.runtime.observers`` and see every self-attention call with its
(step, block), the rotated-space Q, K, V (BHND) and the model's own FP16 attention:

* :class:`QKVCapture` records, for chosen steps and blocks, token-subsampled Q, smoothed K and V
  (the tensors the rotation is learned on), and optionally writes them as tensor dumps
  (:func:`rotvid.rope.dumps.save_qkv_dump`) for ``benchmarks/accuracy_study.py``;
* :class:`AccuracyProbe` measures the quantized attention against the FP16 attention on the
  same inputs (cosine, relative L2) for every (step, block): the input of the adaptive schedule.
  With a block map configured it also measures the quantized attention under the map at every (step, block) the
  schedule's sparsity rules leave sparse -- for top-p, once per candidate ``tau`` -- the input of the choice of
  ``tau`` per block.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

import rotvid.kernels as kernels
from rotvid.kernels import metrics
from rotvid.pipelines.adaptive_schedule import AccuracyTable
from rotvid.kernels.recipes import get_recipe, int4
from rotvid.kernels.sparsity import SparsitySpec
from rotvid.kernels.sparsity.oracle import block_attention_mass, kept_mass, oracle_kept_mass
from rotvid.pipelines.runtime import AttentionSite
from rotvid.pipelines.token_grid import patch_sizes
from rotvid.rope.hadamard import vo_hadamard_block

logger = logging.getLogger(__name__)


def _valid_keys(kv_lens: torch.Tensor | None, b: int, n: int) -> int:
    return n if kv_lens is None else int(kv_lens[b])


@dataclass
class DumpSpec:
    """Where and how to write tensor dumps of captured calls (grid = latent (f, h, w) after patching)."""

    directory: Path
    model: str
    family: str
    grid: tuple[int, int, int]
    text_position: str  # "none" | "first" | "last"


TEXT_POSITION_BY_TOKEN_ORDER = {"video": "none", "video,text": "last", "text,video": "first"}


def latent_grid(pipe, transformer, *, height: int, width: int, frames: int) -> tuple[int, int, int]:
    """The (f, h, w) token grid a pipeline's transformer sees for a video of that size.

    Latent frames ``(frames - 1) // temporal + 1`` and pixels ``// spatial`` (the pipeline's VAE
    factors), then the transformer's patch sizes (Wan: ``patch_size`` (t, h, w); HunyuanVideo and
    CogVideoX: ``patch_size`` and ``patch_size_t``).
    """
    pt, ph, pw = patch_sizes(transformer)
    t_lat = (frames - 1) // int(pipe.vae_scale_factor_temporal) + 1
    sp = int(pipe.vae_scale_factor_spatial)
    return -(-t_lat // pt), height // sp // ph, width // sp // pw


@dataclass
class QKVCapture:
    """Record subsampled Q, smoothed K and V per block (see the module docstring).

    Attributes:
        steps: the denoising steps to capture (``None``: all).
        blocks: the global block indices to capture (``None``: all).
        max_tokens: tokens kept per call and batch row (queries and keys subsampled separately;
            keys and values share their subsample).
        dump: write each captured call's full tensors (batch row 0) as a dump when given.
    """

    steps: set[int] | None = None
    blocks: set[int] | None = None
    max_tokens: int = 512
    seed: int = 0
    dump: DumpSpec | None = None
    samples: dict[tuple[str, int], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    dumps_written: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._gen = torch.Generator().manual_seed(self.seed)

    def _pick(self, n: int) -> torch.Tensor:
        if n <= self.max_tokens:
            return torch.arange(n)
        return torch.randperm(n, generator=self._gen)[: self.max_tokens].sort().values

    def __call__(self, site: AttentionSite, step, num_steps, q, k, v, kv_lens, fp16_attention) -> None:
        if self.steps is not None and step not in self.steps:
            return
        if self.blocks is not None and site.block not in self.blocks:
            return
        for b in range(q.shape[0]):
            n_kv = _valid_keys(kv_lens, b, k.shape[2])
            kb = k[b, :, :n_kv].float()
            kb = kb - kb.double().mean(dim=1, keepdim=True).float()  # K smoothing, as the kernel does
            qi, ki = self._pick(q.shape[2]), self._pick(n_kv)
            self.samples[(site.transformer, site.block)].append(
                (q[b, :, qi.to(q.device)].float().cpu(), kb[:, ki.to(k.device)].cpu(), v[b, :, ki.to(v.device)].float().cpu())
            )
        if self.dump is not None:
            self._write_dump(site, step, q, k, v, kv_lens)

    def _write_dump(self, site, step, q, k, v, kv_lens) -> None:
        from rotvid.rope.dumps import save_qkv_dump

        spec = self.dump
        n_video = spec.grid[0] * spec.grid[1] * spec.grid[2]
        text = q.shape[2] - n_video
        if text < 0 or (text > 0 and spec.text_position == "none"):
            logger.warning("dump skipped: %d tokens do not fit the grid %s", q.shape[2], spec.grid)
            return
        spec.directory.mkdir(parents=True, exist_ok=True)
        path = spec.directory / f"{site.transformer}-block{site.block:03d}-step{step:03d}-{len(self.dumps_written):04d}.safetensors"
        save_qkv_dump(
            path, q[:1], k[:1], v[:1], model=spec.model, family=spec.family, block=site.block, step=step,
            grid=spec.grid, text_tokens=text, text_position=spec.text_position if text else "none",
            kv_len=None if kv_lens is None else int(kv_lens[0]),
        )
        self.dumps_written.append(path)

    def tensors(self, transformer: str, block: int, max_tokens: int | None = None):
        """Captured (q, k, v) of one block, concatenated over calls: [H, N, D] each (CPU, float32).

        Queries and keys are subsampled (again) to ``max_tokens`` in total when given.
        """
        got = self.samples.get((transformer, block))
        if not got:
            raise ValueError(f"block: nothing captured for {transformer} block {block}")
        q = torch.cat([s[0] for s in got], dim=1)
        k = torch.cat([s[1] for s in got], dim=1)
        v = torch.cat([s[2] for s in got], dim=1)
        if max_tokens is not None:
            qi, ki = self._pick_total(q.shape[1], max_tokens), self._pick_total(k.shape[1], max_tokens)
            q, k, v = q[:, qi], k[:, ki], v[:, ki]
        return q, k, v

    def _pick_total(self, n: int, limit: int) -> torch.Tensor:
        return torch.arange(n) if n <= limit else torch.randperm(n, generator=self._gen)[:limit].sort().values


@dataclass
class AccuracyProbe:
    """Measure the quantized recipe against the model's FP16 attention at every (step, block).

    One :class:`AccuracyTable` per transformer (Wan2.2's experts run different steps).

    Block maps: with ``runtime`` set (the runtime of the probe run, whose config carries the block map and the
    schedule's sparsity rules), every call the rules leave sparse is also measured under the map, one
    :class:`AccuracyTable` per transformer and candidate spec in ``sparse_tables``: the config's spec, or for a
    top-p map one spec per ``taus`` entry (the config's ``tau`` when empty). A static map is the forward's
    (:meth:`~rotvid.pipelines.runtime.Runtime.begin_forward`), a top-p map is built from the call's Q and K. Each
    such cell also holds the map's density and, with ``measure_kept_mass`` (the default), the attention mass it
    keeps and the oracle's at the same per-row block counts, from the call's exact block masses (one
    full-precision pass per call, shared by the candidates: :mod:`rotvid.kernels.sparsity.oracle`).
    """

    recipe: str = int4.RECIPE.name
    backend: str = "auto"
    smooth_k: bool = True
    smooth_q: bool | None = None
    smooth_v: bool | None = None  # RotvidConfig's defaults (None: the recipe's): the probe measures what generation runs
    block_n: int | None = None
    vo_online: bool = False  # the online V/O Hadamard around each measured call (RotvidConfig.vo_hadamard="online")
    tables: dict[str, AccuracyTable] = field(default_factory=dict)
    taus: tuple[float, ...] = ()
    runtime: object = None  # a rotvid.pipelines.runtime.Runtime, set once rotvid is applied
    measure_kept_mass: bool = True  # under a map: the kept mass and the oracle's (a full-precision pass per call)
    sparse_tables: dict[str, dict[SparsitySpec, AccuracyTable]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the recipe's smoothing defaults, resolved once (ValueError for a recipe not registered)
        self.smooth_q, self.smooth_v = get_recipe(self.recipe).smoothing(self.smooth_q, self.smooth_v)

    def candidates(self, spec: SparsitySpec) -> tuple[SparsitySpec, ...]:
        """The specs measured where ``spec`` applies: ``spec`` itself, or for top-p one per ``taus`` entry."""
        if spec.static or not self.taus:
            return (spec,)
        return tuple(SparsitySpec(spec.kind, {**spec.options, "tau": tau}) for tau in self.taus)

    def _attend(self, q, k, v, kv_lens, block_map=None):
        # the online V/O Hadamard as generation runs it (fused into the int8-fp8 CUDA call where it can be, the same
        # bits as the PyTorch pair elsewhere)
        return kernels.attention(
            q, k, v, recipe=self.recipe, layout="BHND", backend=self.backend, kv_lens=kv_lens,
            smooth_k=self.smooth_k, smooth_q=self.smooth_q, smooth_v=self.smooth_v,
            block_n=self.block_n, block_map=block_map,
            vo_hadamard=vo_hadamard_block(v.shape[-1]) if self.vo_online else 1,
        )

    def __call__(self, site: AttentionSite, step, num_steps, q, k, v, kv_lens, fp16_attention) -> None:
        table = self.tables.setdefault(site.transformer, AccuracyTable(num_steps=num_steps, num_blocks=site.num_blocks))
        ref = fp16_attention()
        out = self._attend(q, k, v, kv_lens)
        table.add(step, site.block, metrics.cosine_similarity(ref, out), metrics.relative_l2(ref, out))
        runtime = self.runtime
        if runtime is None or not runtime.sparsity_configured:
            return
        spec = runtime.config.schedule.sparsity_at(runtime.config.sparsity, step=step, num_steps=num_steps,
                                                   block=site.block, num_blocks=site.num_blocks)
        if spec is None:
            return
        per = self.sparse_tables.setdefault(site.transformer, {})
        mass = None  # the exact block masses, computed once for every candidate of the call
        for candidate in self.candidates(spec):
            sparse, problem, *_ = runtime.block_map_for_call(site, candidate, q, k, None, kv_lens)
            if problem is not None:
                raise ValueError(problem)
            out = self._attend(q, k, v, kv_lens, sparse.block_map)
            measures = {"density": float(sparse.block_map.density())}
            if self.measure_kept_mass:
                if mass is None:
                    mass = sparse.block_mass
                if mass is None:
                    mass = block_attention_mass(q, k, kv_lens=kv_lens, sm_scale=runtime.call_options["sm_scale"])
                measures.update(_kept_masses(mass, sparse.block_map))
            sparse_table = per.setdefault(candidate, AccuracyTable(num_steps=num_steps, num_blocks=site.num_blocks))
            sparse_table.add(step, site.block, metrics.cosine_similarity(ref, out), metrics.relative_l2(ref, out),
                             **measures)


def _kept_masses(mass: torch.Tensor, block_map) -> dict[str, float]:
    """The attention mass ``block_map`` keeps and the oracle's at its per-row block counts (``mass``: the call's
    exact block masses, :func:`~rotvid.kernels.sparsity.oracle.block_attention_mass`)."""
    visits = block_map.to_dense_mask()
    return {"kept_mass": float(kept_mass(mass, visits, block_map.n_q)),
            "oracle_kept_mass": float(oracle_kept_mass(mass, visits.sum(dim=-1), block_map.n_q))}
