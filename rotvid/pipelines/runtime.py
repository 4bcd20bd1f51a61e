"""The per-call decision and dispatch shared by every rotvid self-attention processor.

For each self-attention call a processor hands over rotated Q, K and V (BHND) and a function
that runs the model's own FP16 attention on them. :meth:`Runtime.attend` then

1. looks the call up in the current *plan* — for each self-attention of each transformer, the
   reason the schedule keeps it in FP16 at the current denoising step, or ``None``;
2. if it runs quantized, checks the call can take the quantized recipe — the mask must be a
   key-padding mask (per-batch valid key lengths), the kernel must accept the inputs, the
   backend must run them — and otherwise runs FP16 and records the reason as a *fallback*;
3. runs the call that step 2 validated and chose a backend for (:func:`rotvid.kernels.dispatch.prepare_attention`,
   then :func:`~rotvid.kernels.dispatch.run_attention`: validated and chosen once);
4. counts the outcome (:mod:`rotvid.pipelines.call_counts`).

Schedule under ``torch.compile``
--------------------------------
The plan — for each self-attention of each transformer, FP16 or not at the current step — is
computed in Python *outside* the transformer, whenever the step tracker changes step (the
scheduler's ``step`` / ``set_timesteps``, or ``tracker.set_step``), and interned: equal plans
are the same tuple of booleans. Inside the transformer only the plan entry of each call is read,
never the step number, and a planned FP16 call is counted as "planned" without its reason; the
reason (``schedule: first 2 steps``, ...) is attached when the counts are drained, which happens
at every step change, before the plan changes. ``torch.compile`` therefore guards on the
plan's booleans, not on the step: a run compiles one graph per *distinct* plan — two for the
paper's presets (every block FP16 in the steps at either end; the mixed steps), one for
``recipe="fp16"`` or a schedule without FP16 steps — and reuses it for every step with that
plan.

A schedule with more than :data:`MAX_PLANS_PER_RUN` distinct plans in a run (a calibrated
``fp16_cells`` table that differs from step to step) would compile that many graphs — and fail
at ``torch._dynamo.config.recompile_limit`` under ``fullgraph=True``. For such a run the plan
goes to the graph *as data* instead: each site's entry is a 0-d bool buffer on its attention
module, set outside the graph at every step, and the call chooses FP16 or the quantized recipe
with ``torch.cond`` on it (counting both outcomes with the flag). One graph serves every step;
the price is the flag's host read at each call (a sync on a GPU) and no CUDA graphs around those
calls. Which way a run goes is decided when it begins (:attr:`Runtime.plan_as_data`) and logged.

The shape-, dtype- and backend-dependent checks of step 2 are decided while tracing (the graph
is specialized on them anyway). The mask check depends on the mask's values: in eager mode it is
decided on the host; under ``torch.compile`` it becomes a device-side flag, the two paths are
joined by ``torch.cond`` and both outcomes are counted with the flag, so a fallback is still
counted and never silent. (``torch.cond`` reads the flag on the host when it runs: one sync per
masked quantized call — HunyuanVideo's text padding — and no CUDA graph around it.)

Calls outside a tracked run
---------------------------
A call while no denoising run is tracked (no ``set_timesteps`` seen, or past the run's last step:
the transformer called directly, by a second pipeline sharing it, by a custom loop) follows the
schedule's **block rules only** (``fp16_first_blocks`` / ``fp16_last_blocks``,
:meth:`~rotvid.pipelines.schedule.Schedule.block_fp16_reason`): the step rules and the
``fp16_cells`` table need a step. :data:`UNTRACKED_RULE` names that rule in the report.

No slow path on a GPU
---------------------
With ``backend="auto"``, a call on a CUDA device that the CUDA kernel cannot take (no nvcc for the
first build, a GPU without a kernel for the recipe, a head_dim or dtype it does not take) runs the
model's own attention, counted as a fallback whose reason starts with :data:`GPU_FALLBACK`; the
report warns once per run with the way to fix it. The PyTorch reference runs only when asked
(``backend="reference"``) or off the GPU (the CPU).

Block maps
----------
With a block map configured (``RotvidConfig(sparsity=...)``, or a block's own spec in the schedule's
``block_sparsity``) a call the plan quantizes also looks up its *sparse plan* entry: the spec it runs under, or
``None`` when the schedule's sparsity rules keep it dense (:meth:`~rotvid.pipelines.schedule.Schedule.sparsity_at`).
An FP16 call never gets a map. The sparse plan is computed with the plan, outside the graph, and interned the same
way; it changes with the step only through ``dense_first_steps`` and the plan (the entries of the calls the plan
keeps FP16 are ``None``), so it adds at most one graph per plan (``torch.compile`` guards on it as on the plan:
distinct (plan, sparse plan) pairs count toward :data:`MAX_PLANS_PER_RUN`; with the plan as data, the sparse plan
keeps every entry, and the graphs are one per distinct sparse plan -- at most two).

* A **static** map (``radial``) depends on the token grid alone. The forward guard (outside the graph) computes
  the grid of each transformer forward from its inputs (:func:`rotvid.pipelines.token_grid.forward_token_grid`) and
  :meth:`Runtime.begin_forward` builds the maps once per (grid, device), cached; the call reads its map from there.
  A forward the guard did not see (``torch.compile(transformer)`` traces the guard: compile with
  ``apply(..., compile=True)`` or ``transformer.compile()``), or a grid that does not fit the call, is a counted
  fallback with its reason.
* A **dynamic** map (``topp``, ``pmin``) is built per call from the call's rotated Q and K (a RoPE·R table deferred to
  the kernel is applied first: the estimate needs the rotated tensors), inside the graph.

The map goes to the backend choice with the call (:func:`~rotvid.kernels.dispatch.prepare_attention`): every CUDA
kernel takes it (the Hopper kernels on sm90, the mma.sync ones elsewhere), and so does the reference backend; a call
no backend takes is a counted fallback (the model's own attention) with the reason. Each call that runs with a map adds its density and, for
top-p, its mean estimated dropped mass to the site's sums (:meth:`SiteCounters.add_sparse
<rotvid.pipelines.call_counts.SiteCounters.add_sparse>`), drained into the report per step.

* **Kept mass** (``RotvidConfig(measure_kept_mass=True)``; always for ``oracle`` maps): each call with a map also
  adds the true attention mass of the blocks its map keeps and the oracle's at the same per-row counts
  (:meth:`Runtime.kept_masses`, :mod:`rotvid.kernels.sparsity.oracle`): a full-precision pass per call (the
  ``oracle`` builder's own masses are reused), for evaluation. ``oracle`` maps log a warning once per ``apply``:
  they are an evaluation tool.

Ring attention
--------------
Under ring attention (:mod:`rotvid.pipelines.ring`) a call gets ``key_chunks = R``: k and v hold every key of the
ring, ``R`` equal chunks in order, and the mask covers them all. The decision, the checks and the counts are the
call's, once; the FP16 path attends every key at once (the model's own attention); the quantized path is prepared
on the first chunk with ``return_lse=True`` and run once per chunk (each with its own key padding), the partials
merged by their log-sum-exp (:func:`rotvid.pipelines.ring.attend_key_chunks`). A backend that returns no LSE
refuses the call at that preparation: a counted fallback (with ``backend="auto"`` on a GPU, a GPU fallback naming
``return_lse``). Block maps are refused under ring attention at ``apply``; a call that still has one here is a
counted fallback.

Non-finite redo
---------------
While :attr:`Runtime.redo` is set (the forward guard re-running a forward whose output was not
finite, :mod:`rotvid.pipelines.forward_guard`), every call runs the model's own attention, counted
as FP16 with the reason :data:`REDO`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from rotvid.kernels.dispatch import AttentionCall, prepare_attention, run_attention, unrotate_output
from rotvid.kernels.recipes import get_recipe
from rotvid.kernels.rope_op import apply_generalized_rope
from rotvid.kernels.sparsity import SparseMap, SparsitySpec, TokenGrid, build_block_map
from rotvid.kernels.sparsity.oracle import block_attention_mass, kept_mass, oracle_kept_mass
from rotvid.pipelines.call_counts import SiteCounters
from rotvid.pipelines.config import RotvidConfig
from rotvid.pipelines.report import GPU_FALLBACK, UNTRACKED_RULE, RunReport
from rotvid.pipelines.ring import attend_key_chunks, chunk_key_lengths
from rotvid.pipelines.step_tracker import StepTracker, StepUnknownError
from rotvid.rope.hadamard import vo_hadamard_block

__all__ = [
    "AttentionSite", "Runtime", "key_padding_lengths", "key_padding_lengths_on_device", "on_cuda_device", "REDO",
    "UNTRACKED_RULE", "GPU_FALLBACK",
]

logger = logging.getLogger(__name__)

# Above this many distinct plans in a run, compiled graphs read the plan as data (module docstring).
MAX_PLANS_PER_RUN = 4
PLANNED = "planned"  # an FP16 call of the schedule, counted without its reason (see the module docstring)
REDO = "redo: the forward's output was not finite, run again with FP16 attention"
MASK_NOT_PADDING = (
    "attention mask is not a key-padding mask with at least one valid key per batch row "
    "(checked on the device under torch.compile)"
)


@dataclass(frozen=True)
class AttentionSite:
    """Where a self-attention sits.

    Attributes:
        transformer: pipeline attribute of its transformer (``transformer`` / ``transformer_2``).
        block: global index in execution order over all stacks (0-based).
        num_blocks: number of self-attentions in that transformer.
        stack: index of the block stack; block_in_stack / stack_size: position in it.
    """

    transformer: str
    block: int
    num_blocks: int
    stack: int
    block_in_stack: int
    stack_size: int

    @property
    def key(self) -> str:
        return f"{self.transformer}/{self.block}"


# Token grids whose static maps a runtime keeps (the oldest is dropped past that).
_STATIC_MAP_GRIDS = 8


def _mean(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.mean()


def on_cuda_device(t: torch.Tensor) -> bool:
    """True for a tensor on a CUDA device (where ``backend="auto"`` never runs the slow PyTorch reference)."""
    return t.device.type == "cuda"


def run_into_bnhd(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rope=None) -> torch.Tensor:
    """A call prepared on BHND q, k, v (:func:`rotvid.kernels.dispatch.prepare_attention`), run in the BNHD layout.

    The result is a BHND view of BNHD memory, so the processors' ``out.transpose(1, 2).flatten(2, 3)`` back to
    ``[B, N, H·D]`` is a view, not a copy of the whole attention output (one read and one write of it per call).
    Every backend takes both layouts (and accepts a transposed view as it accepts the tensor: the checks read the
    same strides); the values are those of the BHND call. A call prepared with ``v_hadamard`` returns the attention of
    the rotated V, which :func:`rotvid.kernels.dispatch.unrotate_output` turns back (keeping this layout), unless its
    kernel turned it back already (``AttentionCall.v_hadamard_out_fused``: the int8-fp8 CUDA call).
    """
    out = run_attention(call, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="BNHD", rope=rope)
    return out.transpose(1, 2)


def run_key_chunks(call: AttentionCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   kv_lens: torch.Tensor | None, chunks: int) -> torch.Tensor:
    """A call prepared with ``return_lse=True`` on the first of ``chunks`` equal key chunks of ``k``, ``v`` (BHND),
    run on each chunk in the BNHD layout (as :func:`run_into_bnhd`) with the chunk's key padding, and the partials
    merged by their LSE (:func:`rotvid.pipelines.ring.attend_key_chunks`); ``kv_lens`` over all the keys. Returns
    [B, H, N_q, D] in q's dtype. With ``v_hadamard`` each chunk's V is rotated (in the kernel's pre-processing or in
    PyTorch) and the merged output is still rotated: one :func:`rotvid.kernels.dispatch.unrotate_output` after the
    merge undoes it (attention, and the merge, are linear in V) -- unless the kernel turned each chunk back
    (``AttentionCall.v_hadamard_out_fused``), and the merge is the attention of v already."""

    def run_chunk(k_c, v_c, lens):
        out, lse = run_attention(call, q.transpose(1, 2), k_c.transpose(1, 2), v_c.transpose(1, 2), layout="BNHD",
                                 kv_lens=lens)
        return out.transpose(1, 2), lse.transpose(1, 2)  # (BHND views; the LSE [B, N, H] -> [B, H, N])

    return attend_key_chunks(run_chunk, k, v, kv_lens, chunks).to(q.dtype)


def attention_into_bnhd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rope=None, **opts) -> torch.Tensor:
    """:func:`rotvid.kernels.attention` on BHND q, k, v (``opts`` its arguments, ``layout`` BHND), run in the BNHD
    layout as :func:`run_into_bnhd`."""
    return run_into_bnhd(prepare_attention(q, k, v, **opts), q, k, v, rope=rope)


def key_padding_lengths(mask: torch.Tensor | None, batch: int, n_kv: int) -> tuple[torch.Tensor | None, str | None]:
    """Express an attention mask as per-batch valid key lengths, if it is one.

    Accepts boolean masks (True = attend) or additive float masks (0 = attend, -inf = masked)
    of shape [B, N_kv], [B, 1, N_kv] or [B, 1, 1, N_kv] whose valid keys form a prefix
    ``0 .. len-1`` in every batch row (HunyuanVideo's text-padding mask).

    Returns:
        ``(kv_lens int32 [B] or None when nothing is masked, None)`` on success, or
        ``(None, reason)`` when the mask cannot be expressed that way.
    """
    if mask is None:
        return None, None
    shape = tuple(mask.shape)
    if mask.dim() not in (2, 3, 4) or shape[0] != batch or shape[-1] != n_kv or any(s != 1 for s in shape[1:-1]):
        return None, f"attention mask of shape {shape} is not a per-batch key-padding mask [B, 1, 1, N_kv]"
    m = mask.reshape(batch, n_kv)
    if m.dtype == torch.bool:
        valid = m
    elif m.dtype.is_floating_point:
        finite = torch.isfinite(m)
        if bool(((m != 0) & finite).any()):
            return None, "additive attention mask has values other than 0 and -inf (a bias, not a padding mask)"
        valid = m == 0
    else:
        return None, f"attention mask of dtype {m.dtype} (expected bool or float)"
    lens = valid.sum(dim=-1)
    prefix = torch.arange(n_kv, device=m.device).unsqueeze(0) < lens.unsqueeze(1)
    if not bool(torch.equal(prefix, valid)):
        return None, "attention mask's valid keys are not a prefix of the sequence (not expressible as kv_lens)"
    if int(lens.min()) < 1:
        return None, "attention mask leaves a batch row with no valid key"
    if int(lens.min()) == n_kv:
        return None, None
    return lens.to(torch.int32), None


def key_padding_lengths_on_device(
    mask: torch.Tensor, batch: int, n_kv: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, str | None]:
    """:func:`key_padding_lengths` without a host sync, for a compiled graph.

    Returns:
        ``(kv_lens int32 [B], ok bool 0-d, None)`` where ``ok`` says (on the device) whether the
        mask is a prefix key-padding mask with at least one valid key per row — ``kv_lens`` is
        only meaningful where ``ok`` holds — or ``(None, None, reason)`` when the mask's shape or
        dtype alone rules it out.
    """
    shape = tuple(mask.shape)
    if mask.dim() not in (2, 3, 4) or shape[0] != batch or shape[-1] != n_kv or any(s != 1 for s in shape[1:-1]):
        return None, None, f"attention mask of shape {shape} is not a per-batch key-padding mask [B, 1, 1, N_kv]"
    m = mask.reshape(batch, n_kv)
    if m.dtype == torch.bool:
        valid, ok = m, torch.ones((), dtype=torch.bool, device=m.device)
    elif m.dtype.is_floating_point:
        valid = m == 0
        ok = ~((m != 0) & torch.isfinite(m)).any()
    else:
        return None, None, f"attention mask of dtype {m.dtype} (expected bool or float)"
    lens = valid.sum(dim=-1)
    prefix = torch.arange(n_kv, device=m.device).unsqueeze(0) < lens.unsqueeze(1)
    ok = ok & (prefix == valid).all() & (lens >= 1).all()
    return lens.to(torch.int32), ok, None


class Runtime:
    """Shared state of one ``apply``: config, step tracker, report, plan, counters, mask cache."""

    def __init__(self, config: RotvidConfig, tracker: StepTracker, report: RunReport):
        if config.smooth_q is None or config.smooth_v is None:  # (apply passes it resolved; a bare Runtime may not)
            config = config.resolved(config.recipe)
        self.config = config
        # False for a recipe that runs the model's own attention (fp16): no plan, every call FP16.
        self.quantized = get_recipe(config.recipe).quantized
        # The options of every quantized call, from the config resolved once (recipe, smoothing, tiles).
        self.call_options = dict(
            recipe=config.recipe, layout="BHND", sm_scale=None, smooth_k=config.smooth_k, smooth_q=config.smooth_q,
            smooth_v=config.smooth_v, block_m=config.block_m, block_n=config.block_n,
        )
        # The online V/O Hadamard (RotvidConfig.vo_hadamard): V·H into each quantized call, its inverse on the
        # output; the FP16 calls run the model's own V (nothing to undo). No weight is touched.
        self.vo_online = config.vo_hadamard == "online"
        self.tracker = tracker
        self.report = report
        self._mask_key: torch.Tensor | None = None
        self._mask_value: tuple[torch.Tensor | None, str | None] = (None, None)
        # Calibration observers (rotvid.pipelines.capture): called on every self-attention call,
        # before the schedule decides, as observer(site, step, num_steps, q, k, v, kv_lens, fp16_attention).
        self.observers: list[Callable] = []
        self.sites: list[AttentionSite] = []
        self.counters: dict[str, SiteCounters] = {}
        self.rotators: list = []
        # {transformer: (FP16 or not, per block)} for the current step; None: no step known.
        self.plan: dict[str, tuple[bool, ...]] | None = None
        # {transformer: (FP16 reason or None, per block)}: the reasons behind self.plan.
        self.plan_reasons: dict[str, tuple[str | None, ...]] = {}
        self.plan_problem: str = "rotvid: the denoising step is unknown"
        self.step_known = False
        # True: compiled graphs read each site's planned-FP16 flag buffer instead of self.plan.
        self.plan_as_data = False
        # True while the forward guard re-runs a non-finite forward: every call runs FP16 (REDO).
        self.redo = False
        self._interned: dict[tuple, tuple] = {}
        self._run_plans: tuple | None = None  # (num_steps, number of sites, [(plan, reasons, sparse) per step])
        # Block maps (module docstring): the specs a run may use, the sparse plan, the static maps of each forward.
        schedule = config.schedule
        specs = [spec for spec in dict.fromkeys((config.sparsity, *schedule.sparsity_specs)) if spec.enabled]
        self.sparsity_configured = bool(specs)
        self.static_specs: tuple[SparsitySpec, ...] = tuple(spec for spec in specs if spec.static)
        # measure every map's kept mass (and the oracle's at its counts) per call: a full-precision pass each
        self.measure_kept_mass = config.measure_kept_mass
        oracles = [str(spec) for spec in specs if spec.kind == "oracle"]
        if oracles:
            logger.warning("rotvid: sparsity %s is an evaluation tool: every call with it runs a full-precision "
                           "attention to find the exact top blocks (far slower than the dense call); not for "
                           "production runs", ", ".join(oracles))
        # {transformer: (spec or None, per block)} for the current step; None: no quantized calls or no step known.
        self.sparse_plan: dict[str, tuple[SparsitySpec | None, ...]] | None = None
        # {transformer: {spec: SparseMap}} of the forward running now, or why it has none (its grid is not known);
        # filled by begin_forward, emptied by end_forward.
        self.forward_maps: dict[str, dict[SparsitySpec, SparseMap] | str] = {}
        self._static_maps: dict[tuple[TokenGrid, torch.device], dict[SparsitySpec, SparseMap]] = {}
        report.sparsity = str(config.sparsity)
        report.schedule = config.schedule.name  # (for the report's words only)
        report.sparsity_rules = {
            "dense_first_steps": schedule.dense_first_steps, "dense_blocks": list(schedule.dense_blocks),
            "block_sparsity": [[b, str(spec)] for b, spec in schedule.block_sparsity],
        }
        tracker.add_listener(self._on_step_change)
        self.refresh_plan()

    # ---- sites, plan, counts (outside the graph) ----------------------------------------------
    def add_site(self, site: AttentionSite, attn: nn.Module, rotator=None) -> None:
        """Register a self-attention (its counters live on ``attn``) and its rotator (a ``QKRotator``)."""
        self.sites.append(site)
        self.counters[site.key] = SiteCounters.install(site.key, attn)
        if rotator is not None and all(r is not rotator for r in self.rotators):
            self.rotators.append(rotator)
        self._run_plans = None
        self.refresh_plan()

    def remove_sites(self) -> None:
        """Count what is pending into the report, then take the counter buffers off."""
        self.drain_counts()
        for counters in self.counters.values():
            counters.uninstall()
        self.counters = {}
        self.sites = []
        self.rotators = []
        self.tracker.remove_listener(self._on_step_change)

    def refresh_plan(self) -> None:
        """Set :attr:`plan` for the tracker's current step (never called inside the graph)."""
        self.step_known = False
        if not self.quantized:
            self.plan, self.plan_reasons, self.sparse_plan = None, {}, None  # every call: "recipe fp16", no step needed
            return
        try:
            step, num_steps = self.tracker.current()
        except StepUnknownError as err:
            # outside a tracked run: the block rules only (module docstring)
            self.plan_problem = str(err)
            plan, reasons, sparse = self._untracked_plan()
            self.plan, self.plan_reasons = plan, reasons
            self.sparse_plan = sparse if self.plan_as_data else self._quantized_only(plan, sparse)
            if self.plan_as_data:
                for site in self.sites:
                    self.counters[site.key].set_planned(self.plan[site.transformer][site.block])
            return
        if self._run_plans is None or self._run_plans[:2] != (num_steps, len(self.sites)):
            plans = [self._plan_at(s, num_steps) for s in range(num_steps)]
            # a graph needs the map entries of its quantized calls only: FP16 cells' entries dropped, fewer graphs
            # (not when the plan goes to the graph as data: one graph then serves every FP16 plan)
            tight = [(plan, reasons, self._quantized_only(plan, sparse)) for plan, reasons, sparse in plans]
            distinct = len({(id(plan), id(sparse)) for plan, _, sparse in tight})
            self.plan_as_data = distinct > MAX_PLANS_PER_RUN
            self._run_plans = (num_steps, len(self.sites), plans if self.plan_as_data else tight)
            if self.plan_as_data:
                logger.info("rotvid: %d distinct plans in this %d-step run (> %d): compiled graphs read the plan "
                            "as data", distinct, num_steps, MAX_PLANS_PER_RUN)
        self.plan, self.plan_reasons, self.sparse_plan = self._run_plans[2][step]
        self.step_known = True
        if self.plan_as_data:
            for site in self.sites:
                self.counters[site.key].set_planned(self.plan[site.transformer][site.block])

    def _plan_at(self, step: int | None, num_steps: int | None) -> tuple[dict, dict, dict | None]:
        """(interned plan, reasons, interned sparse plan or None) of ``step`` (``None``: outside a tracked run, the
        block rules only)."""
        sched = self.config.schedule
        per: dict[str, list[str | None]] = {}
        sparse: dict[str, list[SparsitySpec | None]] = {}
        for site in self.sites:
            reasons = per.setdefault(site.transformer, [None] * site.num_blocks)
            specs = sparse.setdefault(site.transformer, [None] * site.num_blocks)
            if step is None:
                reason = sched.block_fp16_reason(block_in_stack=site.block_in_stack, stack_size=site.stack_size)
                reasons[site.block] = None if reason is None else "outside a tracked run, " + reason
            else:
                reasons[site.block] = sched.fp16_reason(
                    step=step, num_steps=num_steps, block=site.block, num_blocks=site.num_blocks,
                    block_in_stack=site.block_in_stack, stack_size=site.stack_size,
                )
            if self.sparsity_configured:
                specs[site.block] = sched.sparsity_at(self.config.sparsity, step=step, num_steps=num_steps,
                                                      block=site.block, num_blocks=site.num_blocks)
        plan, reasons = self._intern(per)
        return plan, reasons, self._intern_sparse(sparse) if self.sparsity_configured else None

    def _untracked_plan(self) -> tuple[dict, dict, dict | None]:
        return self._plan_at(None, None)

    def _intern(self, per: dict[str, list[str | None]]) -> tuple[dict, dict]:
        plan = {}
        for name, reasons in per.items():
            key = tuple(r is not None for r in reasons)
            plan[name] = self._interned.setdefault(key, key)
        key = ("plan",) + tuple(sorted(plan.items()))
        return self._interned.setdefault(key, plan), {name: tuple(reasons) for name, reasons in per.items()}

    def _quantized_only(self, plan: dict, sparse: dict | None) -> dict | None:
        """The interned sparse plan with ``None`` for the calls ``plan`` keeps FP16 (they never get a map)."""
        if sparse is None:
            return None
        return self._intern_sparse({name: [None if fp16 else spec for fp16, spec in zip(plan[name], specs)]
                                    for name, specs in sparse.items()})

    def _intern_sparse(self, per: dict[str, list[SparsitySpec | None]]) -> dict:
        plan = {}
        for name, specs in per.items():
            key = ("specs",) + tuple(specs)
            plan[name] = self._interned.setdefault(key, tuple(specs))
        key = ("sparse",) + tuple(sorted((name, id(specs)) for name, specs in plan.items()))
        return self._interned.setdefault(key, plan)

    def _on_step_change(self, phase: str) -> None:
        if phase == "leave":
            self.drain_counts()
        else:
            self.refresh_plan()

    def drain_counts(self) -> None:
        """Move the device counters into the report (the forward guard counts the forwards themselves)."""
        block_of = {site.key: site for site in self.sites}

        def sink(key: str, outcome: str, detail: str, n: int) -> None:
            site = block_of[key]
            if outcome == "fp16" and detail == PLANNED:
                detail = self.plan_reasons[site.transformer][site.block]
            self.report.record(key, outcome, detail, n)

        SiteCounters.drain(list(self.counters.values()), sink)
        if self.sparsity_configured:
            step = self.tracker.step if self.tracker.in_run() else None
            for key, sums in SiteCounters.drain_sparse(list(self.counters.values())).items():
                self.report.record_sparse(key, step, sums)

    # ---- static block maps, per transformer forward (outside the graph) ---------------------------------------
    def begin_forward(self, transformer: str, grid: TokenGrid | None, device: torch.device,
                      problem: str | None = None) -> None:
        """The static block maps of ``transformer``'s forward on ``grid`` (cached per grid and device), or none,
        with ``problem`` saying why, when the grid is not known (module docstring). Nothing without a static
        spec."""
        if not self.static_specs:
            return
        if grid is not None:
            key = (grid, torch.device(device))
            maps = self._static_maps.get(key)
            if maps is None:
                try:
                    maps = self._build_static_maps(grid, key[1])
                except ValueError as err:
                    grid, problem = None, str(err)
                else:
                    if len(self._static_maps) >= _STATIC_MAP_GRIDS:  # (a few resolutions per process at most)
                        self._static_maps.pop(next(iter(self._static_maps)))
                    self._static_maps[key] = maps
        self.forward_maps[transformer] = maps if grid is not None else f"no token grid for this forward ({problem})"

    def end_forward(self, transformer: str) -> None:
        """Forget the maps of ``transformer``'s forward (no later call reads a map of another grid)."""
        self.forward_maps.pop(transformer, None)

    def _build_static_maps(self, grid: TokenGrid, device: torch.device) -> dict[SparsitySpec, SparseMap]:
        # a static kind reads the call's shape and device only: a stride-0 stand-in for q and k
        stub = torch.empty((), device=device).expand(1, 1, grid.num_tokens, 1)
        return {spec: build_block_map(spec, stub, stub, grid=grid) for spec in self.static_specs}

    def planned_sparsity(self, site: AttentionSite) -> SparsitySpec | None:
        """The block map spec of this site's quantized calls at the current step (None: dense)."""
        plan = self.sparse_plan
        return None if plan is None else plan[site.transformer][site.block]

    def block_map_for_call(self, site: AttentionSite, spec: SparsitySpec, q, k, rope, kv_lens):
        """``(SparseMap or None, problem or None, q, k, rope)`` for a call under ``spec`` (module docstring); a
        dynamic map rotates q and k first when their RoPE·R table was deferred (``rope`` is then None)."""
        if spec.static:
            maps = self.forward_maps.get(site.transformer, "no token grid for this forward (the forward guard did not "
                                         "run: compile with apply(compile=True) or transformer.compile(), not "
                                         "torch.compile(transformer))")
            if isinstance(maps, str):
                return None, f"sparsity {spec}: {maps}", q, k, rope
            sparse = maps[spec]
            if (sparse.block_map.n_q, sparse.block_map.n_kv) != (q.shape[2], k.shape[2]):
                return None, (f"sparsity {spec}: the token grid of this forward has {sparse.block_map.n_q} tokens, the "
                              f"call {q.shape[2]} queries and {k.shape[2]} keys"), q, k, rope
            return sparse, None, q, k, rope
        if rope is not None:
            q, k, rope = apply_generalized_rope(q, rope), apply_generalized_rope(k, rope), None
        try:
            sparse = build_block_map(spec, q, k, layout="BHND", kv_lens=kv_lens, sm_scale=self.call_options["sm_scale"])
        except ValueError as err:
            return None, f"sparsity {spec}: {err}", q, k, rope
        return sparse, None, q, k, rope

    def kept_masses(self, spec: SparsitySpec, sparse: SparseMap, q, k, rope, kv_lens):
        """``(kept mass or None, oracle kept mass or None, q, k, rope)`` of a call's map: measured when the config
        asks (``measure_kept_mass``) and always for ``oracle`` maps (0-d device values, no sync). The exact block
        masses come from the map when its builder computed them (``oracle``), else from one full-precision pass
        (:func:`~rotvid.kernels.sparsity.oracle.block_attention_mass`; a deferred RoPE·R table is applied first)."""
        if not (self.measure_kept_mass or spec.kind == "oracle"):
            return None, None, q, k, rope
        mass = sparse.block_mass
        if mass is None:
            if rope is not None:
                q, k, rope = apply_generalized_rope(q, rope), apply_generalized_rope(k, rope), None
            mass = block_attention_mass(q, k, kv_lens=kv_lens, sm_scale=self.call_options["sm_scale"])
        bm = sparse.block_map
        visits = bm.to_dense_mask()
        return (kept_mass(mass, visits, bm.n_q), oracle_kept_mass(mass, visits.sum(dim=-1), bm.n_q), q, k, rope)

    def clear_forward_state(self) -> None:
        """Forget per-forward state (the rotators' in-graph table memo); hooked before and after each forward."""
        for rotator in self.rotators:
            rotator.end_forward()

    # ---- per call -----------------------------------------------------------------------------
    def kv_lens_for(self, mask: torch.Tensor | None, batch: int, n_kv: int) -> tuple[torch.Tensor | None, str | None]:
        """:func:`key_padding_lengths`, cached on the mask object (one per transformer forward)."""
        if mask is None:
            return None, None
        if self._mask_key is mask:
            return self._mask_value
        value = key_padding_lengths(mask, batch, n_kv)
        self._mask_key, self._mask_value = mask, value
        return value

    def planned_fp16(self, site: AttentionSite) -> str | None:
        """The detail to count when the plan keeps this call in FP16 (None: run the quantized recipe).

        ``"recipe fp16"`` (the recipe's name), or :data:`PLANNED`, which :meth:`drain_counts` replaces by the
        schedule's reason.
        """
        if not self.quantized:
            return f"recipe {self.config.recipe}"
        plan = self.plan
        if plan is None:
            raise StepUnknownError(self.plan_problem)
        return PLANNED if plan[site.transformer][site.block] else None

    def _vo_block(self, v: torch.Tensor) -> int:
        """The block of the online V/O Hadamard of a quantized call on ``v`` (1: none; ``vo_hadamard`` not
        ``online``, or an odd head_dim): the call's ``v_hadamard`` (:func:`rotvid.kernels.dispatch.prepare_attention`,
        which decides whether the kernel rotates V in its pre-processing and un-rotates the output itself -- in its
        epilogue at head_dim 128, by one pass at 64 -- or both run outside it)."""
        return vo_hadamard_block(v.shape[-1]) if self.vo_online else 1

    def attend(
        self,
        site: AttentionSite,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        fp16_attention: Callable[[], torch.Tensor],
        rope=None,
        key_chunks: int = 1,
    ) -> torch.Tensor:
        """Run one self-attention.

        Args:
            site: where the call sits.
            q, k, v: [B, H, N, D] (BHND), rotated (or, with ``rope``, still to be rotated), in the model's dtype.
            mask: the attention mask the model passed (``None`` for none).
            fp16_attention: runs the model's own attention on the rotated (q, k, v, mask), returns BHND.
            rope: ``None``, or the RoPE·R table (:class:`~rotvid.rope.fused_table.GeneralizedRopeTable`) still to
                be applied to q and k: the quantized call hands it to :func:`rotvid.kernels.attention`, whose
                CUDA int8-fp8 pre-processing applies it itself (one pass less), and ``fp16_attention`` rotates.
            key_chunks: under ring attention, the number of equal key chunks k and v hold (the ring's degree): the
                quantized recipe runs once per chunk and merges by LSE (module docstring); 1: one call.

        Returns:
            [B, H, N_q, D] in q's dtype.
        """
        compiling = torch.compiler.is_compiling()
        if self.redo:  # the forward guard re-runs a non-finite forward: FP16 throughout
            self.counters[site.key].add("fp16", REDO)
            return fp16_attention()
        if self.observers and rope is not None:  # observers see rotated tensors
            q, k, rope = apply_generalized_rope(q, rope), apply_generalized_rope(k, rope), None
        if self.observers:
            if compiling:
                raise RuntimeError("rotvid: calibration observers cannot run under torch.compile; calibrate eagerly")
            step, num_steps = self.tracker.current()
            obs_kv_lens, _ = self.kv_lens_for(mask, k.shape[0], k.shape[2])
            for observer in self.observers:
                observer(site, step, num_steps, q, k, v, obs_kv_lens, fp16_attention)
        counters = self.counters[site.key]
        # ``run``: None, or a 0-d bool the device decides with (the quantized path is taken where True).
        run = None
        if compiling and self.plan_as_data and self.quantized:
            planned = counters.planned
            counters.add("fp16", PLANNED, planned)
            run = ~planned
        else:
            reason = self.planned_fp16(site)
            if reason is not None:
                counters.add("fp16", reason)
                return fp16_attention()
        ok = None
        if compiling and mask is not None:
            kv_lens, ok, problem = key_padding_lengths_on_device(mask, k.shape[0], k.shape[2])
        else:
            kv_lens, problem = self.kv_lens_for(mask, k.shape[0], k.shape[2])
        sparse = None
        spec = self.planned_sparsity(site)
        kept = oracle_kept = None
        if problem is None and spec is not None and key_chunks > 1:  # (apply refuses it: check_ring_config)
            problem = f"sparsity {spec}: block maps are not split per key chunk under ring attention"
        if problem is None and spec is not None:
            sparse, problem, q, k, rope = self.block_map_for_call(site, spec, q, k, rope, kv_lens)
            if sparse is not None:
                kept, oracle_kept, q, k, rope = self.kept_masses(spec, sparse, q, k, rope, kv_lens)
        if problem is None:
            block_map = None if sparse is None else sparse.block_map
            # the online V/O Hadamard's block (1: none), and where it runs, decided with the backend
            vo = dict(v_hadamard=self._vo_block(v))
            try:  # validated and the backend chosen once, here
                if key_chunks > 1:  # on the first key chunk, with its key padding and the LSE
                    n_c = k.shape[2] // key_chunks
                    lens0, _ = chunk_key_lengths(kv_lens, 0, n_c)
                    call = prepare_attention(q, k[:, :, :n_c], v[:, :, :n_c], backend=self.config.backend,
                                             kv_lens=lens0, return_lse=True, **vo, **self.call_options)
                else:
                    call = prepare_attention(q, k, v, backend=self.config.backend, kv_lens=kv_lens,
                                             block_map=block_map, **vo, **self.call_options)
            except ValueError as e:
                problem = "kernel cannot take this call: " + e.args[0]
            else:
                if self.config.backend == "auto" and call.backend.name == "reference" and on_cuda_device(q):
                    # no slow path on a GPU: the model's own attention, counted (module docstring)
                    problem = GPU_FALLBACK + call.reason.removeprefix("reference (auto; ").removesuffix(")")
        if problem is not None:
            counters.add("fallback", problem, 1 if run is None else run)
            return fp16_attention()
        why = call.reason
        if run is None and ok is None:
            counters.add("quantized", why)
            if sparse is not None:
                counters.add_sparse(sparse.block_map.density(), _mean(sparse.dropped_mass), kept_mass=kept,
                                    oracle_kept_mass=oracle_kept)
            if key_chunks > 1:  # (V rotated per chunk, O un-rotated per chunk or once after the merge: linear in V)
                return unrotate_output(call, run_key_chunks(call, q, k, v, kv_lens, key_chunks))
            return unrotate_output(call, run_into_bnhd(call, q, k, v, rope=rope))
        # Compiled, and the device decides: the plan as data, a mask checked on the device, or both.
        take = run if ok is None else (ok if run is None else run & ok)
        counters.add("quantized", why, take)
        if sparse is not None:
            counters.add_sparse(sparse.block_map.density(), _mean(sparse.dropped_mass), take, kept_mass=kept,
                                oracle_kept_mass=oracle_kept)
        if ok is not None:
            counters.add("fallback", MASK_NOT_PADDING, ~ok if run is None else run & ~ok)
        operands = (q, k, v) if kv_lens is None else (q, k, v, kv_lens)

        def quantized(q, k, v, *lens):
            if key_chunks > 1:
                out = run_key_chunks(call, q, k, v, lens[0] if lens else None, key_chunks)
            else:
                out = run_attention(call, q, k, v, kv_lens=lens[0] if lens else None, rope=rope)
            return unrotate_output(call, out)

        def fp16(q, k, v, *lens):
            return fp16_attention()

        return torch.cond(take, quantized, fp16, operands)
