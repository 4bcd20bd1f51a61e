"""Building blocks of the tiny random pipelines the family modules build (:mod:`rotvid.pipelines.tiny`).

A word-level tokenizer built in-process with ``tokenizers`` and wrapped in ``PreTrainedTokenizerFast`` (nothing from
the hub), the size constants every tiny pipeline shares, and a 2-layer T5-style text encoder. ``transformers`` and
``tokenizers`` are imported when a part is built, not with this module.
"""

from __future__ import annotations

__all__ = ["HEAD_DIM", "TEXT_LEN", "WORDS", "t5_text_encoder", "tiny_tokenizer", "vocab_size"]

WORDS = (
    "a the of and in on with to is at by from for over under near "
    "cat dog bird fish horse car boat tree river sea sky sun moon city street forest mountain "
    "red green blue yellow black white small big fast slow bright dark "
    "runs walks flies swims jumps drives sits stands looks turns video camera scene light"
).split()

HEAD_DIM = 64  # every tiny transformer's attention head dim
TEXT_LEN = 16  # text tokens of every tiny pipeline's call (``max_sequence_length``)


def tiny_tokenizer(*, specials: dict[str, str], post: str | None = None, model_max_length: int = 512):
    """A word-level ``PreTrainedTokenizerFast`` built in-process.

    Args:
        specials: ``{"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>", ...}``;
            they take the first ids, in order.
        post: ``"eos"`` appends the eos token (T5 style), ``"bos"`` prepends bos (Llama style),
            ``"bos_eos"`` wraps in both (CLIP style), ``None`` adds nothing.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in specials.values():
        vocab.setdefault(tok, len(vocab))
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    unk = specials.get("unk_token", next(iter(specials.values())))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if post is not None:
        bos, eos = specials.get("bos_token"), specials.get("eos_token")
        single = {"eos": f"$A {eos}", "bos": f"{bos} $A", "bos_eos": f"{bos} $A {eos}"}[post]
        used = [t for t in (bos, eos) if t is not None and t in single]
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, vocab[t]) for t in used]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, **specials)


def vocab_size() -> int:
    """The tiny text encoders' vocabulary: :data:`WORDS` and room for the special tokens."""
    return len(WORDS) + 8


def t5_text_encoder(model_cls, config_cls, text_dim: int) -> tuple:
    """``(tokenizer, text encoder)`` of the T5 family (``model_cls`` / ``config_cls``: ``UMT5EncoderModel`` /
    ``UMT5Config`` or ``T5EncoderModel`` / ``T5Config``): a 2-layer encoder of width ``text_dim`` on the tiny
    vocabulary, its tokenizer appending eos."""
    tokenizer = tiny_tokenizer(specials={"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}, post="eos")
    text_encoder = model_cls(
        config_cls(
            vocab_size=vocab_size(), d_model=text_dim, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0,
            eos_token_id=1, decoder_start_token_id=0,
        )
    ).eval()
    return tokenizer, text_encoder
