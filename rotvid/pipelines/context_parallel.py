"""Context parallelism around rotvid's self-attention (diffusers' ``ContextParallelConfig``): Ulysses, ring, both.

diffusers 0.42.1 runs a transformer over P processes with
``transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=P))``: the model's
``_cp_plan`` (Wan: split ``hidden_states`` along the sequence at ``blocks.0`` and the RoPE table
the same way, gather at ``proj_out``) hooks the forward so that every block sees 1/P of the
tokens with all H heads. Its own processors then call ``dispatch_attention_fn`` with the
parallel config, which does the Ulysses all-to-all inside diffusers' templated attention.

rotvid's processors replace that attention call, so they do the Ulysses exchange themselves
(:func:`ulysses_attend`), in the processor, around :meth:`~rotvid.pipelines.runtime.Runtime.attend`:

1. Q/K/V projections, QK norm and RoPE·R run on the local sequence shard (all per token: the
   plan splits the RoPE table exactly like the tokens);
2. **all-to-all** (:func:`sequence_to_heads`): ``[B, H, N/P, D]`` → ``[B, H/P, N, D]`` — the full
   sequence for this rank's H/P heads (an attention mask over the local keys is all-gathered to
   the full key sequence, as diffusers' own Ulysses does);
3. ``Runtime.attend`` on those tensors, unchanged: the schedule's decision, the FP16 cells on the
   model's own attention (diffusers' dispatcher *without* the parallel config — SDPA for the
   ``native`` backend — since the tensors are already whole), or the quantized recipe;
4. **inverse all-to-all** (:func:`heads_to_sequence`): ``[B, H/P, N, D]`` → ``[B, H, N/P, D]``.

Smoothing stays equal to the single-GPU result because it is computed **after** the all-to-all,
on the full sequence: the K, V and Q means are per head over all valid keys (queries for Q), and each rank holds every token of its heads, in the
original order. The per-token / per-group quantization that follows is per head too, so running
it after the exchange gives the same numbers as one GPU (no all-reduce is needed). The price is
that the exchange carries the model's dtype (bf16), not INT4 codes.

Ring attention and Ulysses × ring
---------------------------------
With ``ring_degree = R > 1`` (``ContextParallelConfig(ring_degree=R, ulysses_degree=U)``, ``U ≥ 1``) the plan splits
the sequence over all ``U·R`` ranks (diffusers' flattened ``("ring", "ulysses")`` mesh: rank ``r·U + u`` holds piece
``r·U + u``). :func:`context_parallel_attend` then runs

1. the Ulysses all-to-all over the ``U`` ranks of the rank's ring index (when ``U > 1``): ``[B, H, N/(UR), D]`` →
   ``[B, H/U, N/R, D]``, the contiguous segment ``r`` of the sequence for ``H/U`` heads;
2. an all-gather of K and V over the ``R`` ranks of the ring (:func:`rotvid.pipelines.ring.gather_sequence`): every
   key of those heads, in sequence order (the key-padding mask was all-gathered over all ``U·R`` ranks first);
3. ``Runtime.attend`` with ``key_chunks=R``: the FP16 path attends all keys at once; the quantized recipe runs once
   per key chunk with the log-sum-exp and merges (:mod:`rotvid.pipelines.ring`, which also says why the LSE must
   be of the unsmoothed scores);
4. the inverse all-to-all.

Heads need only divide by ``U``: 12 heads on 8 GPUs run as Ulysses 4 × ring 2, 40 heads on 3 GPUs as ring 3
(:func:`split_degrees` picks ``U = gcd(heads, world)``). The backend must return the LSE: the reference does for
every recipe; a ``backend="cuda"`` whose recipe's kernel returns none is refused at ``apply``
(:func:`rotvid.pipelines.attach.check_ring_config`), and with ``backend="auto"`` on a GPU such calls are the counted, reported
GPU fallbacks of :mod:`rotvid.pipelines.runtime`. Block maps (``sparsity``) are refused under ring attention.

Supported: Ulysses, ring and both, equal shards (no ``ulysses_anything`` / ``ring_anything``), heads divisible by
``ulysses_degree``, families whose diffusers transformer ships a ``_cp_plan``
(:attr:`~rotvid.pipelines.families.base.Family.context_parallel`). Anything else is one
clear ``ValueError``.

What else must agree across the ranks
-------------------------------------
Every rank runs every forward and every self-attention call, and each call is a collective (the
all-to-all, the ring's all-gather), so anything that makes one rank skip or repeat work must be decided identically
on all of them:

* the **non-finite redo** of the forward guard (:mod:`rotvid.pipelines.forward_guard`): decided by
  :func:`any_rank` (one MAX all-reduce of a 0/1 flag per forward over every rank of the context-parallel mesh);
* **diffusers' cache hooks** (``transformer.enable_cache``): TaylorSeer decides from the step
  alone, the same on every rank. FirstBlockCache compares the first block's residual **of this
  rank's shard** with a threshold, so ranks can disagree (one skips the remaining blocks and their
  all-to-alls, another does not: a hang). MagCache decides from the step and its ``mag_ratios``,
  but diffusers 0.42.1's hook pairs the first block's *unsplit* input (the ``_cp_plan`` splits
  inside that block's hooks) with the last block's shard: a shape error on the first forward
  under CP. :func:`check_cache_under_context_parallel` refuses both -- and any cache not known to
  work under CP -- with one error naming the cache and context parallelism (at ``apply`` and at
  every forward, as the other checks of :func:`check_context_parallel`);
* the schedule's plan and the block maps: computed from the step and the token grid, the same on
  every rank (the maps on the full sequence of the rank's heads, after the exchange).

:func:`enable_context_parallel` is the one call that puts a transformer under context
parallelism on GPUs (``enable_parallelism``) and on CPUs with gloo, where diffusers 0.42.1's
``enable_parallelism`` cannot run (it divides by ``torch.accelerator.device_count()``, 0 there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from rotvid.pipelines.families.base import Family

__all__ = [
    "UlyssesGroup",
    "RankGroup",
    "ContextParallelGroups",
    "ulysses_group",
    "context_parallel_groups",
    "check_context_parallel",
    "sequence_to_heads",
    "heads_to_sequence",
    "gather_key_mask",
    "ulysses_attend",
    "context_parallel_attend",
    "split_degrees",
    "enable_context_parallel",
    "check_cache_under_context_parallel",
    "any_rank",
    "CACHES_AGREEING_ACROSS_RANKS",
]


@dataclass(frozen=True)
class RankGroup:
    """A process group one exchange runs over (a dimension of diffusers' context-parallel mesh, or all of it).

    Attributes:
        group: the ``torch.distributed`` process group.
        degree: number of ranks P in it.
        rank: this process's rank in it (= index of its sequence shard, or segment for the ring).
    """

    group: object
    degree: int
    rank: int


# The Ulysses exchange's group (the name it has always had).
UlyssesGroup = RankGroup


@dataclass(frozen=True)
class ContextParallelGroups:
    """The groups of one context-parallel run (module docstring).

    Attributes:
        world: every rank of the mesh (diffusers' flattened ``("ring", "ulysses")`` mesh, in the order the
            sequence is split in): the key mask's gather, :func:`any_rank`.
        ulysses: the Ulysses all-to-all's group, or None (``ulysses_degree == 1``).
        ring: the ring's group, or None (``ring_degree == 1``).
    """

    world: RankGroup
    ulysses: RankGroup | None
    ring: RankGroup | None


def _cp_config(parallel_config):
    """The ``ContextParallelConfig`` inside a diffusers ``ParallelConfig`` (or ``None``)."""
    if parallel_config is None:
        return None
    return getattr(parallel_config, "context_parallel_config", None)


def _rank_group(mesh, degree: int) -> RankGroup:
    group = mesh.get_group()
    return RankGroup(group=group, degree=int(degree), rank=dist.get_rank(group))


def context_parallel_groups(parallel_config) -> ContextParallelGroups | None:
    """The groups of a diffusers ``ParallelConfig``, or ``None`` when it runs no context parallelism.

    Raises:
        ValueError: ``ulysses_anything`` / ``ring_anything``, or a config that was never set up (no
            ``enable_parallelism``).
    """
    cp = _cp_config(parallel_config)
    if cp is None:
        return None
    if cp.ulysses_anything or cp.ring_anything:
        raise ValueError(
            "parallel_config: rotvid needs equal sequence shards; ulysses_anything / ring_anything is not supported"
        )
    if cp.ulysses_degree == 1 and cp.ring_degree == 1:
        return None
    if cp._ulysses_mesh is None or cp._ring_mesh is None or cp._flattened_mesh is None:
        raise ValueError(
            "parallel_config: the ContextParallelConfig was not set up; call transformer.enable_parallelism "
            "(or rotvid.pipelines.context_parallel.enable_context_parallel) first"
        )
    u, r = int(cp.ulysses_degree), int(cp.ring_degree)
    return ContextParallelGroups(
        world=_rank_group(cp._flattened_mesh, u * r),
        ulysses=_rank_group(cp._ulysses_mesh, u) if u > 1 else None,
        ring=_rank_group(cp._ring_mesh, r) if r > 1 else None,
    )


def ulysses_group(parallel_config) -> UlyssesGroup | None:
    """The Ulysses group of a diffusers ``ParallelConfig`` (None: no context parallelism, or ``ulysses_degree``
    1); :func:`context_parallel_groups` for all of them."""
    groups = context_parallel_groups(parallel_config)
    return None if groups is None else groups.ulysses


def _check_heads(heads: int, degree: int, where: str) -> None:
    if heads % degree != 0:
        raise ValueError(
            f"ulysses_degree: {where} has {heads} attention heads, which {degree} ranks cannot split evenly "
            f"(Ulysses needs heads divisible by ulysses_degree; {heads} % {degree} = {heads % degree}; ring attention "
            f"does not: ContextParallelConfig(ulysses_degree={math.gcd(heads, degree)}, "
            f"ring_degree={degree // math.gcd(heads, degree)}) runs {heads} heads on {degree} ranks)"
        )


def check_context_parallel(family: Family, transformer: nn.Module, where: str, *, cp_families: tuple[str, ...] = (),
                           check_ring: Callable[[int], None] | None = None) -> ContextParallelGroups | None:
    """Check that rotvid can run ``transformer`` under its context-parallel config (if any). Under ring attention
    ``check_ring(ring_degree)`` runs after the checks of the config itself: what the rotvid config must not ask
    there -- a block map, a kernel without the log-sum-exp -- is
    :func:`rotvid.pipelines.attach.check_ring_config`'s (it reads the recipes, which this module does not import).

    ``cp_families``: the registered families that can run context-parallel (named in the refusal).

    Returns:
        The :class:`ContextParallelGroups`, or ``None`` when the transformer is not context-parallel.

    Raises:
        ValueError: the family has no diffusers ``_cp_plan``, uneven parallelism, heads not divisible by
            ``ulysses_degree``.
    """
    parallel_config = getattr(transformer, "_parallel_config", None)
    if _cp_config(parallel_config) is None:
        return None
    if not family.context_parallel:
        raise ValueError(
            f"pipe: {where} ({type(transformer).__name__}) runs context-parallel, but diffusers 0.42.1 ships no "
            f"context-parallel plan (_cp_plan) for {family.name}; rotvid supports context parallelism for "
            f"{', '.join(cp_families)} only"
        )
    cp = _cp_config(parallel_config)
    _check_heads(int(transformer.config.num_attention_heads), int(cp.ulysses_degree), where)
    if cp.ring_degree > 1 and check_ring is not None:
        check_ring(int(cp.ring_degree))
    groups = context_parallel_groups(parallel_config)
    if groups is not None:
        check_cache_under_context_parallel(transformer, where)
    return groups


# diffusers cache configs whose skip decision reads the denoising step (and fixed settings) only, never the
# hidden states, so every rank of a context-parallel run decides the same, and that run under CP (module docstring)
CACHES_AGREEING_ACROSS_RANKS = ("TaylorSeerCacheConfig",)
_WHY_REFUSED = {
    "FirstBlockCacheConfig": "its skip decision compares the first block's residual of each rank's own sequence "
                             "shard with the threshold, so ranks can decide differently and the skipping rank "
                             "leaves the others waiting in the all-to-all",
    "MagCacheConfig": "diffusers 0.42.1's MagCache hook takes the first block's input before the context-parallel "
                      "split and the last block's output after it (a shape mismatch on the first forward)",
}


def check_cache_under_context_parallel(transformer: nn.Module, where: str) -> None:
    """Refuse a diffusers cache whose skip decisions could differ between the ranks of a context-parallel run.

    Raises:
        ValueError: naming the cache and context parallelism, for a cache not in
            :data:`CACHES_AGREEING_ACROSS_RANKS` (FirstBlockCache: its threshold test reads the first block's
            residual of each rank's own sequence shard; MagCache: diffusers' hook fails under CP).
    """
    cache = getattr(transformer, "_cache_config", None)
    if cache is None:
        return
    name = type(cache).__name__
    if name in CACHES_AGREEING_ACROSS_RANKS:
        return
    why = _WHY_REFUSED.get(name, "rotvid does not know that its skip decisions agree on every rank")
    raise ValueError(
        f"cache: {where} runs under context parallelism with the diffusers cache {name}; {why}. Use "
        f"{' or '.join(c.removesuffix('Config') for c in CACHES_AGREEING_ACROSS_RANKS)} (decided from the step "
        f"alone), or run on one process"
    )


def any_rank(flag: torch.Tensor | bool, group: RankGroup | None, device: torch.device | str | None = None) -> bool:
    """True when ``flag`` holds on any rank of ``group`` (one MAX all-reduce of a 0/1 int32; a collective: every
    rank calls it). ``flag``: a host bool or a 0-d bool tensor (then on its device, read once after the reduce).
    Without a group: ``bool(flag)``.
    """
    if group is None:
        return bool(flag)
    if isinstance(flag, torch.Tensor):
        value = flag.reshape(()).to(torch.int32)
    else:
        value = torch.tensor(int(bool(flag)), dtype=torch.int32, device=device)
    value = value.reshape(1).clone()
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group.group)
    return bool(value.item())


def _exchange(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """all-to-all over dim 0 (size P): chunk j goes to rank j; chunk i of the result came from rank i."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group.group)
    return out


def sequence_to_heads(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """All-to-all ``[B, H, N/P, D]`` (this rank's sequence shard, all heads; BHND) → ``[B, H/P, N, D]``.

    Rank r receives heads ``r·H/P .. (r+1)·H/P - 1`` of every shard, shards in rank order (the
    order diffusers' sharder split the sequence in), so the result is the full sequence.
    """
    b, h, n_local, d = x.shape
    p = group.degree
    _check_heads(h, p, "the self-attention")
    chunks = x.reshape(b, p, h // p, n_local, d).transpose(0, 1).contiguous()  # [P, B, H/P, N/P, D]
    got = _exchange(chunks, group)  # [P (sequence shard), B, H/P, N/P, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * n_local, d)


def heads_to_sequence(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """The inverse of :func:`sequence_to_heads`: ``[B, H/P, N, D]`` → ``[B, H, N/P, D]`` (BHND)."""
    b, h_local, n, d = x.shape
    p = group.degree
    if n % p != 0:
        raise ValueError(f"x: sequence length {n} is not divisible by ulysses_degree {p}")
    chunks = x.reshape(b, h_local, p, n // p, d).permute(2, 0, 1, 3, 4).contiguous()  # [P (shard), B, H/P, N/P, D]
    got = _exchange(chunks, group)  # [P (head chunk), B, H/P, N/P, D]
    return got.transpose(0, 1).reshape(b, p * h_local, n // p, d)


def gather_key_mask(mask: torch.Tensor | None, n_kv_local: int, group: RankGroup) -> torch.Tensor | None:
    """An attention mask over the local keys (last dim ``N/P``), all-gathered to the full key sequence of ``group``
    (in its rank order: the mesh's whole group, or the Ulysses group of a Ulysses-only run).

    A mask whose last dim is already the full length ``N`` is returned as it is.

    Raises:
        ValueError: a mask whose last dim is neither ``N/P`` nor ``N``.
    """
    if mask is None:
        return None
    n_last = mask.shape[-1]
    if n_last == n_kv_local * group.degree:
        return mask
    if n_last != n_kv_local:
        raise ValueError(
            f"attention_mask: last dim {n_last} is neither the local key count {n_kv_local} nor the full "
            f"{n_kv_local * group.degree} (ulysses_degree {group.degree})"
        )
    mask = mask.contiguous()
    parts = [torch.empty_like(mask) for _ in range(group.degree)]
    dist.all_gather(parts, mask, group=group.group)
    return torch.cat(parts, dim=-1)


def ulysses_attend(
    group: UlyssesGroup,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """Ulysses self-attention of one sequence shard.

    Args:
        group: the :class:`UlyssesGroup`.
        q, k, v: ``[B, H, N/P, D]`` (BHND), this rank's shard, already rotated (RoPE·R).
        mask: attention mask over the local keys (``[..., N/P]``) or the full keys, or ``None``.
        attend: ``attend(q, k, v, mask)`` on ``[B, H/P, N, D]`` (full sequence, H/P heads) with the
            full-key mask; returns ``[B, H/P, N, D]``. Smoothing and quantization happen inside
            it, on the full sequence (see the module docstring).

    Returns:
        ``[B, H, N/P, D]``: this shard's attention output, all heads.
    """
    n_kv_local = k.shape[2]
    full_mask = gather_key_mask(mask, n_kv_local, group)
    qf, kf, vf = (sequence_to_heads(t, group) for t in (q, k, v))
    out = attend(qf, kf, vf, full_mask)
    return heads_to_sequence(out, group)


def context_parallel_attend(
    groups: ContextParallelGroups,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    attend: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """Self-attention of one sequence shard under Ulysses, ring, or Ulysses × ring (module docstring).

    Args:
        groups: the :class:`ContextParallelGroups`.
        q, k, v: ``[B, H, N/(U·R), D]`` (BHND), this rank's shard, already rotated (RoPE·R).
        mask: attention mask over the local keys (``[..., N/(U·R)]``) or over all ``N``, or ``None``.
        attend: ``attend(q, k, v, mask, key_chunks)``: q ``[B, H/U, N/R, D]`` (segment ``r`` of the sequence, this
            rank's heads), k and v ``[B, H/U, N, D]`` (every key of the ring, ``key_chunks = R`` equal chunks in
            order), the mask over all ``N`` keys; returns ``[B, H/U, N/R, D]``.

    Returns:
        ``[B, H, N/(U·R), D]``: this shard's attention output, all heads.
    """
    from rotvid.pipelines.ring import gather_sequence

    full_mask = gather_key_mask(mask, k.shape[2], groups.world)
    if groups.ulysses is not None:
        q, k, v = (sequence_to_heads(t, groups.ulysses) for t in (q, k, v))
    chunks = 1
    if groups.ring is not None:
        k, v = (gather_sequence(t, groups.ring.group, groups.ring.degree) for t in (k, v))
        chunks = groups.ring.degree
    out = attend(q, k, v, full_mask, chunks)
    return out if groups.ulysses is None else heads_to_sequence(out, groups.ulysses)


def split_degrees(heads: int, world: int) -> tuple[int, int]:
    """``(ulysses_degree, ring_degree)`` for ``heads`` attention heads on ``world`` ranks: the largest Ulysses
    degree that divides both (``gcd``), the ring for the rest -- 40 heads on 8: (8, 1); 12 on 8: (4, 2); 40 on 3:
    (1, 3)."""
    u = math.gcd(int(heads), int(world))
    return u, world // u


def enable_context_parallel(transformer: nn.Module, ulysses_degree: int, ring_degree: int = 1):
    """Put ``transformer`` under diffusers' context parallelism: Ulysses over ``ulysses_degree`` ranks, times ring
    attention over ``ring_degree`` (``ulysses_degree=1`` for ring attention alone; :func:`split_degrees` chooses
    both for a head count).

    Needs ``torch.distributed`` initialized with ``ulysses_degree · ring_degree`` ranks (``torchrun`` /
    ``rotvid generate --gpus N``). On a machine with an accelerator this is exactly
    ``transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=U, ring_degree=R))`` (set
    ``torch.cuda.set_device(local_rank)`` and move the model first). On a CPU-only machine it does
    the same steps by hand with a CPU device mesh, because diffusers 0.42.1's
    ``enable_parallelism`` computes ``rank % torch.accelerator.device_count()``, which is a
    division by zero there: record the set-up ``ParallelConfig`` on the model and on every
    attention processor that has a ``_parallel_config``, then install the model's ``_cp_plan``
    hooks (``diffusers.hooks.apply_context_parallel``).

    Call it before or after :func:`rotvid.pipelines.apply` (rotvid's processors hand the config
    to the diffusers processors they replaced).

    Returns:
        The diffusers ``ParallelConfig`` now on the transformer.

    Raises:
        ValueError: a degree that is not an int ≥ 1, both 1, a product that differs from the world size, a
            ``ulysses_degree`` that does not divide the heads, or a model without ``_cp_plan``; torch.distributed
            not initialized.
    """
    from diffusers import ContextParallelConfig

    for name, degree in (("ulysses_degree", ulysses_degree), ("ring_degree", ring_degree)):
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {degree!r}")
    if ulysses_degree * ring_degree < 2:
        raise ValueError(f"ulysses_degree: expected an int >= 2 (or ring_degree >= 2), got {ulysses_degree!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ulysses_degree: torch.distributed is not initialized (launch with torchrun)")
    world = dist.get_world_size()
    if world != ulysses_degree * ring_degree:
        raise ValueError(f"ulysses_degree: expected ulysses_degree · ring_degree = the world size {world}, got "
                         f"{ulysses_degree} · {ring_degree}")
    heads = getattr(getattr(transformer, "config", None), "num_attention_heads", None)
    if heads is not None:
        _check_heads(int(heads), ulysses_degree, type(transformer).__name__)
    if getattr(transformer, "_cp_plan", None) is None:
        raise ValueError(f"transformer: {type(transformer).__name__} has no _cp_plan in this diffusers version")
    cp = ContextParallelConfig(ulysses_degree=ulysses_degree, ring_degree=ring_degree)
    if torch.accelerator.device_count() > 0:
        transformer.enable_parallelism(config=cp)
        return transformer._parallel_config
    return _enable_on_cpu(transformer, cp)


def _enable_on_cpu(transformer: nn.Module, cp):
    """``enable_parallelism``'s steps with a CPU device mesh (see :func:`enable_context_parallel`)."""
    from diffusers import ParallelConfig
    from diffusers.hooks import apply_context_parallel
    from torch.distributed.device_mesh import init_device_mesh

    if getattr(transformer, "_parallel_config", None) is not None:
        raise ValueError(f"transformer: parallelism is already enabled on this {type(transformer).__name__}")
    mesh = init_device_mesh("cpu", cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)
    transformer._parallel_config = config
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_parallel_config"):
            processor._parallel_config = config
    apply_context_parallel(transformer, cp, transformer._cp_plan)
    return config
