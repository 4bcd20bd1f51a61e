"""rotvid.rope: 3D RoPE and the RoPE-aware rotations of RotateAttention.

Modules (import what you need from them):

- :mod:`rotvid.rope.model_facts` — ``get_rope_facts``: per-model RoPE facts (:class:`~rotvid.rope.facts.RopeFacts`),
  kept in each family's module of :mod:`rotvid.pipelines.families`, which registers them there.
- :mod:`rotvid.rope.tables` — ``rope_table_3d``, ``apply_rope_interleaved``.
- :mod:`rotvid.rope.rotations` — ``Rotation``, ``make_rotation`` (none / interleaved / half /
  full / learned), learned-rotation files.
- :mod:`rotvid.rope.fused_table` — ``GeneralizedRopeTable``, ``fuse_rope_and_rotation``,
  ``apply_generalized_rope`` (RoPE and a pair rotation in one element-wise op).
- :mod:`rotvid.rope.hadamard` — ``hadamard_matrix``, ``fuse_v_hadamard`` / ``unfuse_v_hadamard``
  (offline V/O Hadamard in diffusers attention modules).
- :mod:`rotvid.rope.incoherence` — Ψ (paper Eq. 1-2) and per-segment summaries.
- :mod:`rotvid.rope.synthetic` — SYNTHETIC RoPE-structured Q/K/V for CPU studies.
- :mod:`rotvid.rope.dumps` — save/load Q/K/V captured from real model runs.
"""
