"""A Gemma 2 model folder as dataset-initialize reads it (config.json and tokenizer, no weights), built offline."""

from __future__ import annotations

import io
import json

import pytest

# Tiny dims as Gemma 2's released config.json writes its fields (no weights: only the tokenizer is used).
GEMMA2_CONFIG = {
    "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256000,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096,
    "query_pre_attn_scalar": 32,
}  # fmt: skip


@pytest.fixture(scope="session")
def gemma2_tokenizer_only(tmp_path_factory):
    """config.json + a SentencePiece `tokenizer.model` trained on the tiny task's text, with Gemma's special ids
    (pad 0, eos 1, bos 2, unk 3). Treat as read-only."""
    import sentencepiece

    from kfp_finetune.tiny.dataset import make_rows

    train, held_out = make_rows(seed=0, train_rows=2000, eval_rows=0)
    lines = [f"{row['input']} {row['output']}" for row in train + held_out]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=120,
        hard_vocab_limit=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("models") / "gemma2-tokenizer-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GEMMA2_CONFIG))
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return folder
