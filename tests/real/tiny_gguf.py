"""A tiny random-weight llama GGUF (about 0.5 MB) for a real ``llama-server``.

The output is random bytes, which is all a protocol test needs: real routes, real envelopes,
real streaming, real usage and timings. :func:`write_gguf` writes the same model at another
:class:`Shape`: the multi-turn bench (bench/README.md) needs one large enough that reading a
long conversation takes the engine a noticeable time.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from gguf import GGUFWriter, TokenType


class Shape(NamedTuple):
    """The model's size: embedding width, feed-forward width, layers, attention heads, and the
    context it was "trained" for (the most a server may give it)."""

    embed: int
    ffn: int
    blocks: int
    heads: int
    context: int


TINY = Shape(embed=64, ffn=128, blocks=2, heads=4, context=256)
EMBED, FFN, BLOCKS, HEADS, CONTEXT = TINY

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [str(d) for d in range(10)]
    pieces += ["▁the", "▁a", "▁hi", "▁hello", "▁there", "er", "in", "on", "an", "re", "."]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: Path, seed: int = 7) -> Path:
    """Write the tiny model to ``path`` and return it."""
    return write_gguf(path, TINY, seed)


def write_gguf(path: Path, shape: Shape, seed: int = 7) -> Path:
    """Write the model at ``shape`` to ``path`` and return it."""
    embed, ffn, blocks, heads, context = shape
    if embed % heads or (embed // heads) % 2:
        raise ValueError(f"{shape}: the embedding must split into heads of an even width")
    rng = np.random.default_rng(seed)

    def weights(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.02).astype(np.float32)

    tokens, scores, types = _vocabulary()
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(context)
    writer.add_embedding_length(embed)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(embed // heads)
    writer.add_file_type(0)  # ALL_F32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)
    vocab = len(tokens)
    writer.add_tensor("token_embd.weight", weights(vocab, embed))
    writer.add_tensor("output_norm.weight", np.ones(embed, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, embed))
    for block in range(blocks):
        prefix = f"blk.{block}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(embed, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(prefix + name + ".weight", weights(embed, embed))
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(embed, dtype=np.float32))
        writer.add_tensor(prefix + "ffn_gate.weight", weights(ffn, embed))
        writer.add_tensor(prefix + "ffn_up.weight", weights(ffn, embed))
        writer.add_tensor(prefix + "ffn_down.weight", weights(embed, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
