"""The proxy's text encoder reads fixed word offsets, so a colour word's role shows in its embedding."""

import pytest
import torch

from rotvid.pipelines.proxy.build import PROXY_DIR, TEXT_HEAD_OFFSETS, build_text_encoder, proxy_tokenizer

PROMPTS = ["a blue triangle moves up on a green background", "a green triangle moves up on a blue background"]


def _encode(encoder, **kw):
    ids = proxy_tokenizer()(PROMPTS, return_tensors="pt", padding="max_length", max_length=16, truncation=True)
    with torch.no_grad():
        return encoder(input_ids=ids.input_ids, attention_mask=ids.attention_mask, **kw), ids.attention_mask


def test_each_head_reads_its_offset_and_is_frozen():
    encoder = build_text_encoder().eval()
    encoder.set_attn_implementation("eager")
    out, mask = _encode(encoder, output_attentions=True)
    n = int(mask[0].sum())
    for layer in out.attentions:
        for h, off in enumerate(TEXT_HEAD_OFFSETS):
            for i in range(n):
                if 0 <= i + off < n:
                    assert layer[0, h, i, i + off] > 0.999, (h, i)
    frozen = [n for n, p in encoder.named_parameters() if not p.requires_grad]
    assert len(frozen) == 3 * len(encoder.encoder.block)
    assert all(n.endswith(("q.weight", "k.weight", "relative_attention_bias.weight")) for n in frozen)


def test_bundled_encoder_tells_object_colour_from_background_colour():
    from transformers import UMT5EncoderModel

    encoder = UMT5EncoderModel.from_pretrained(PROXY_DIR / "text_encoder", torch_dtype=torch.float32).eval()
    for block in encoder.encoder.block:
        assert block.layer[0].SelfAttention.q.weight.abs().max() == 0  # the fixed pattern was shipped
    out, _ = _encode(encoder)
    h = out.last_hidden_state
    # "blue" as the object's colour (position 1) vs as the background's (position 7): clearly apart
    assert torch.nn.functional.cosine_similarity(h[0, 1], h[1, 7], dim=0) < 0.9


def test_wrong_head_count_is_refused():
    from transformers import UMT5Config, UMT5EncoderModel

    from rotvid.pipelines.proxy.build import fix_text_attention

    enc = UMT5EncoderModel(UMT5Config(vocab_size=30, d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="TEXT_HEAD_OFFSETS"):
        fix_text_attention(enc)
