"""rotvid self-attention processors for Wan, HunyuanVideo and CogVideoX (diffusers 0.42.1).

Each processor mirrors, line for line, the maths of the diffusers processor it replaces —
``WanAttnProcessor``, ``HunyuanVideoAttnProcessor2_0``, ``CogVideoXAttnProcessor2_0`` — except
for two steps:

* the RoPE step becomes RoPE·R on the video tokens and R alone on the text tokens
  (:class:`~rotvid.pipelines.qk_rotation.QKRotator`); where RoPE covers every token through one
  table (Wan), the table goes to the attention call instead, and the int8-fp8 CUDA pre-processing
  applies it in its own pass (no separate RoPE·R pass; the FP16 path rotates first);
* the attention call goes through :meth:`~rotvid.pipelines.runtime.Runtime.attend`, which runs
  the quantized recipe or — by the schedule or as a recorded fallback — the model's own
  attention function on the same rotated tensors (diffusers' ``dispatch_attention_fn`` with the
  original processor's backend for Wan / HunyuanVideo, ``F.scaled_dot_product_attention`` for
  CogVideoX, exactly as diffusers does).

Under diffusers' context parallelism (Wan) the attention call is wrapped in rotvid's own exchanges
(:func:`rotvid.pipelines.context_parallel.context_parallel_attend`): each call gets its sequence
shard, rotates it, exchanges it for the full sequence of H/P heads (Ulysses) and/or gathers the
keys of the ring (ring attention: the quantized recipe per key chunk, merged by log-sum-exp),
attends, and exchanges back.

The V/O Hadamard lives in the weights (fused by ``apply``), so nothing here touches V.
Processors are installed with ``attn.set_processor`` on self-attention modules only; their
``__call__`` signatures are the originals' (diffusers' ``Attention.forward`` filters keyword
arguments by that signature).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn

from rotvid.pipelines.context_parallel import context_parallel_attend, context_parallel_groups
from rotvid.pipelines.qk_rotation import QKRotator
from rotvid.pipelines.runtime import AttentionSite, Runtime
from rotvid.kernels.rope_op import apply_generalized_rope

__all__ = [
    "RotvidProcessorBase",
    "WanRotvidAttnProcessor",
    "HunyuanVideoRotvidAttnProcessor",
    "CogVideoXRotvidAttnProcessor",
    "PROCESSORS",
]


class RotvidProcessorBase:
    """Common state: the runtime, the call site, the rotator and the processor it replaced.

    Attributes:
        original: the diffusers processor that was installed before (restored by ``remove``);
            its ``_attention_backend`` / ``_parallel_config`` drive the FP16 path.
    """

    def __init__(self, runtime: Runtime, site: AttentionSite, rotator: QKRotator, original):
        self.runtime = runtime
        self.site = site
        self.rotator = rotator
        self.original = original

    @property
    def _parallel_config(self):
        """The diffusers parallel config, kept on the replaced processor.

        ``enable_parallelism`` after ``apply`` sets it through here, so the processor ``remove``
        restores has it too.
        """
        return getattr(self.original, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, value):
        self.original._parallel_config = value

    def _dispatch_fp16(self, q, k, v, mask):
        """diffusers' own attention on BHND q/k/v (it takes BNHD); returns BHND.

        No parallel config is passed: under context parallelism the tensors are already the
        full sequence (rotvid's Ulysses exchange ran before; under ring attention, the keys of the whole ring).
        """
        out = dispatch_attention_fn(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            dropout_p=0.0,
            is_causal=False,
            backend=getattr(self.original, "_attention_backend", None),
            parallel_config=None,
        )
        return out.transpose(1, 2)

    def _sdpa_fp16(self, q, k, v, mask):
        """Plain SDPA on BHND q/k/v (CogVideoX's own processor calls it directly)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)

    def _rotate_and_attend(self, q, k, v, rope, span, mask, fp16=None):
        """RoPE·R on Q and K (R alone outside ``span``), then the runtime's decision and attention.

        ``fp16`` runs the model's own attention on (q, k, v, mask); default: diffusers' dispatcher.
        Returns BHND.
        """
        fp16 = self._dispatch_fp16 if fp16 is None else fp16
        groups = context_parallel_groups(self._parallel_config)
        table = None
        if groups is None and not self.runtime.observers:
            table = self.rotator.deferred_table(q, rope, span)
        if table is not None:
            # RoPE·R left to the call: the int8-fp8 CUDA pre-processing applies it itself; FP16 rotates here.
            def fp16_rotated():
                return fp16(apply_generalized_rope(q, table), apply_generalized_rope(k, table), v, mask)

            return self.runtime.attend(self.site, q, k, v, mask=mask, fp16_attention=fp16_rotated, rope=table)
        q = self.rotator.rotate(q, rope, span)
        k = self.rotator.rotate(k, rope, span)

        def attend(q, k, v, mask, key_chunks=1):
            return self.runtime.attend(self.site, q, k, v, mask=mask, fp16_attention=lambda: fp16(q, k, v, mask),
                                       key_chunks=key_chunks)

        if groups is None:
            return attend(q, k, v, mask)
        if self.runtime.observers:
            raise ValueError(
                f"parallel_config: {self.site.key} runs context-parallel; calibration observers (rotvid calibrate) "
                "would see only this rank's heads — calibrate on one process"
            )
        return context_parallel_attend(groups, q, k, v, mask, attend)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(site={self.site.key}, rotation={self.rotator.kind})"


class WanRotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``WanAttnProcessor`` on ``WanTransformerBlock.attn1`` (self-attention).

    Tokens: video only, RoPE on all of them (``rotary_emb`` = (cos, sin), each [1, N, 1, D]).
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None or attn.add_k_proj is not None:
            raise RuntimeError(f"rotvid: {self.site.key} is installed as self-attention but got cross-attention inputs")
        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)

        query = attn.norm_q(query)
        key = attn.norm_k(key)

        q = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        v = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)

        out = self._rotate_and_attend(q, k, v, rotary_emb, (0, q.shape[2]), attention_mask)
        hidden_states = out.transpose(1, 2).flatten(2, 3)
        hidden_states = hidden_states.type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


class HunyuanVideoRotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``HunyuanVideoAttnProcessor2_0`` on the double- and single-stream blocks.

    Joint sequence [video, text]; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on
    the video tokens; the text-padding mask [B, 1, 1, N] becomes per-batch ``kv_lens``.
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        single_stream = attn.add_q_proj is None and encoder_hidden_states is not None
        if single_stream:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)

        # 1. QKV projections (B, N, H, D) and 2. QK norm, as diffusers.
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        # 4. Text-stream projections of the double-stream blocks.
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            encoder_query = attn.add_q_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            encoder_key = attn.add_k_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            encoder_value = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            if attn.norm_added_q is not None:
                encoder_query = attn.norm_added_q(encoder_query)
            if attn.norm_added_k is not None:
                encoder_key = attn.norm_added_k(encoder_key)
            n_video = query.shape[1]
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)
        elif single_stream:
            n_video = query.shape[1] - encoder_hidden_states.shape[1]
        else:
            n_video = query.shape[1]

        q = query.transpose(1, 2)
        k = key.transpose(1, 2)
        v = value.transpose(1, 2)
        # 3. RoPE on the video tokens (R alone on the text tokens), 5. attention.
        out = self._rotate_and_attend(q, k, v, image_rotary_emb, (0, n_video), attention_mask)
        hidden_states = out.transpose(1, 2).flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)

        # 6. Output projection.
        if encoder_hidden_states is not None:
            n_text = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-n_text], hidden_states[:, -n_text:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[0](hidden_states)
                hidden_states = attn.to_out[1](hidden_states)
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


class CogVideoXRotvidAttnProcessor(RotvidProcessorBase):
    """Replaces ``CogVideoXAttnProcessor2_0`` on ``CogVideoXBlock.attn1``.

    Joint sequence [text, video]; RoPE (``image_rotary_emb`` = (cos, sin), each [N_video, D]) on
    the video tokens only — and none at all for CogVideoX-2B, where R applies to every token.
    """

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size, sequence_length, _ = hidden_states.shape

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])

        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        inner_dim = key.shape[-1]
        head_dim = inner_dim // attn.heads
        q = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        k = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        v = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)

        span = (text_seq_length, sequence_length)
        out = self._rotate_and_attend(q, k, v, image_rotary_emb, span, attention_mask, fp16=self._sdpa_fp16)
        hidden_states = out.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


PROCESSORS: dict[str, type[RotvidProcessorBase]] = {
    "wan": WanRotvidAttnProcessor,
    "hunyuan_video": HunyuanVideoRotvidAttnProcessor,
    "cogvideox": CogVideoXRotvidAttnProcessor,
}
