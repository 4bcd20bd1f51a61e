"""Ring attention with rotvid's kernels: a query shard attends the key chunks of the ring one by one, merged by LSE.

Under ``ContextParallelConfig(ring_degree=R)`` (alone, or after a Ulysses exchange: Ulysses × ring) rank ``r`` of
the ring holds the queries, keys and values of sequence segment ``r`` (of ``R`` equal segments, in order). Its
queries must attend the keys of every segment. Here, as in diffusers 0.42.1's ``TemplatedRingAttention`` with its
one ``rotate_method="allgather"``, the keys and values of the ring are all-gathered (:func:`gather_sequence`,
:func:`rotvid.pipelines.context_parallel.context_parallel_attend`), and then:

* a **quantized** call runs once per key chunk ``c`` (the keys of segment ``c``) with ``return_lse=True``
  (:func:`rotvid.kernels.dispatch.prepare_attention`), giving the attention output ``O_c`` over that chunk and the
  log-sum-exp ``lse_c`` of each row's scores there; the partials are merged exactly (:func:`merge_partial`):

      O = Σ_c exp(lse_c - lse) · O_c,     lse = ln Σ_c exp(lse_c)

  which is the attention over all keys whenever each ``O_c`` is the attention over chunk ``c`` and ``lse_c`` the
  log-sum-exp of the *same* scores the single call would use. That is why the LSE a backend returns is of the
  unsmoothed scores: K smoothing subtracts a mean over the call's keys, so each chunk's scores are shifted by its
  own ``sm_scale · q·mean_c(k)``, and merging the shifted LSEs would weight the chunks wrongly (not a rounding: a
  factor ``exp(sm_scale · q·(mean_a - mean_b))`` between two chunks). The reference adds the shift back
  (:func:`rotvid.kernels.reference.k_smoothing_lse_shift`), exact in float arithmetic; a global mean (an
  all-reduce) would be exact as well but needs a mean argument in every kernel's pre-processing, and the merge
  would still need an LSE of consistent scores. Every other per-call statistic is chunk-local and safe: V's mean
  and its per-channel (FP8) or per-block (INT4) scales only change how ``O_c`` is computed, and ``O_c`` stays the
  attention over chunk ``c`` (its rows of P sum to 1); Q's mean is the same for every chunk (one query shard) and
  its ΔS correction restores ``q·k_s`` exactly. What differs from one process is quantization noise: K's codes
  are taken after a different mean, Q's after the mean of the shard's queries, V's with the chunk's scale.
* an **FP16** call (the schedule's, a fallback, the non-finite redo) runs the model's own attention once over all
  the gathered keys: diffusers' ``native`` backend returns no LSE, and one call over every key is the
  single-process result for these queries.

Key padding (``kv_lens``, global over the ``N`` keys): chunk ``c`` of ``n_c`` keys gets ``clamp(kv_lens - c n_c, 0,
n_c)`` (:func:`chunk_key_lengths`); a batch row with no valid key in a chunk runs with one key (the kernels need
one) and its LSE set to ``-inf``: weight 0 in the merge, never a NaN.

Block maps (``sparsity``) are refused under ring attention (one error naming ``sparsity`` at ``apply``,
:func:`rotvid.pipelines.context_parallel.check_context_parallel`): a map is per query tile of the whole sequence,
and the query tiles of a ring shard and the blocks of each key chunk would have to be cut out of it (and a top-p
map estimated over all keys) -- not done.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

__all__ = ["merge_partial", "chunk_key_lengths", "attend_key_chunks", "gather_sequence"]


def merge_partial(out: torch.Tensor | None, lse: torch.Tensor | None, out_c: torch.Tensor, lse_c: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one chunk's partial attention into the running result (the online combine of the module docstring).

    Args:
        out, lse: the running output [B, H, N, D] and log-sum-exp [B, H, N] (as returned here), or None before the
            first chunk.
        out_c, lse_c: the chunk's output (any float dtype) and log-sum-exp (natural log; ``-inf`` for a row that
            attended no key of the chunk).

    Returns:
        ``(out, lse)`` in float32 (float64 for float64 partials). A row that is ``-inf`` in both has output 0 and LSE
        ``-inf``; a ``-inf`` side weighs exactly 0 (its output is never multiplied in, so no ``0 · inf`` NaN).
    """
    dt = torch.float64 if out_c.dtype == torch.float64 else torch.float32
    out_c, lse_c = out_c.to(dt), lse_c.to(dt)
    if out is None:
        return out_c.masked_fill(torch.isneginf(lse_c).unsqueeze(-1), 0), lse_c
    m = torch.maximum(lse, lse_c)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w, w_c = torch.exp(lse - m_safe), torch.exp(lse_c - m_safe)  # (0 exactly where a side is -inf)
    total = w + w_c
    denom = torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    merged = (torch.where(w.unsqueeze(-1) > 0, out * w.unsqueeze(-1), 0)
              + torch.where(w_c.unsqueeze(-1) > 0, out_c * w_c.unsqueeze(-1), 0)) / denom
    return merged, m_safe + torch.log(total)


def chunk_key_lengths(kv_lens: torch.Tensor | None, chunk: int, n_chunk: int
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Key padding of key chunk ``chunk`` (keys ``chunk · n_chunk .. + n_chunk`` of the whole sequence).

    Returns:
        ``(lens, empty)``: the valid keys of each batch row in the chunk, at least 1 (int32 [B]; what the kernel
        call takes), and the rows with none (bool [B]: their LSE is set to ``-inf``); ``(None, None)`` without
        padding.
    """
    if kv_lens is None:
        return None, None
    lens = (kv_lens.to(torch.int32) - chunk * n_chunk).clamp(0, n_chunk)
    return lens.clamp_min(1), lens == 0


def attend_key_chunks(
    run_chunk: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]],
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: torch.Tensor | None,
    chunks: int,
) -> torch.Tensor:
    """Attention over ``chunks`` equal key chunks of ``k``, ``v`` [B, H, N_kv, D] (BHND), merged by their LSE.

    Args:
        run_chunk: ``run_chunk(k_c, v_c, lens_c) -> (out_c [B, H, N_q, D], lse_c [B, H, N_q])``: one call with
            ``return_lse`` on a chunk (views of ``k``, ``v``) and its key lengths (:func:`chunk_key_lengths`).
        kv_lens: int [B] over all ``N_kv`` keys, or None.
        chunks: the number of chunks (``N_kv`` divisible by it).

    Returns:
        The merged output [B, H, N_q, D] in float32, or float64 (:func:`merge_partial`; the caller casts).
    """
    n_kv = k.shape[2]
    if n_kv % chunks:
        raise ValueError(f"k: {n_kv} keys do not split into {chunks} equal chunks")
    n_c = n_kv // chunks
    out = lse = None
    for c in range(chunks):
        lens, empty = chunk_key_lengths(kv_lens, c, n_c)
        keys = slice(c * n_c, (c + 1) * n_c)
        out_c, lse_c = run_chunk(k[:, :, keys], v[:, :, keys], lens)
        if empty is not None:
            lse_c = lse_c.masked_fill(empty.to(lse_c.device).view(-1, 1, 1), -torch.inf)
        out, lse = merge_partial(out, lse, out_c, lse_c)
    return out


def gather_sequence(x: torch.Tensor, group, degree: int) -> torch.Tensor:
    """All-gather ``x`` [B, H, n, D] (BHND) over ``group`` along the sequence: ``[B, H, degree · n, D]``, the ranks'
    shards in group-rank order (the order diffusers' sharder split the sequence in)."""
    parts = [torch.empty_like(x) for _ in range(degree)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=2)
