"""Build tiny, offline, deterministic Hugging Face model folders for the transformers / TRL engine.

Unlike `tiny.model` (HF-layout files that torchtune loads), these are made by transformers' own classes: a config,
the model class built from it, every weight redrawn from one seeded `torch.Generator`, then
`save_pretrained(safe_serialization=True)`. Each folder loads with the Auto classes offline (`local_files_only`,
no remote code). Kinds:

- `qwen3_moe`: `Qwen3MoeForCausalLM`, 4 experts (2 per token) in every layer, untied output layer; the tiny Qwen3
  tokenizer (ChatML) of `tiny.tokenizer`.
- `gemma3_vlm`: `Gemma3ForConditionalGeneration` (a 1-layer SigLIP vision tower on 32x32 images, a 2-layer Gemma 3
  text model) and a processor folder (`Gemma3Processor`: image processor, tokenizer with the image tokens, a
  chat template that takes image parts).
- `bert_classifier`: `BertForSequenceClassification` with 5 labels ("1 star" .. "5 stars", as the Yelp review
  task) and a lower-casing WordPiece tokenizer with a vocabulary from `tokenizer.training_corpus()`.

Same arguments give byte-identical files (with the same torch / transformers / tokenizers versions).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KINDS = ("qwen3_moe", "gemma3_vlm", "bert_classifier")
INIT_STD = 0.02
MAX_POSITION_EMBEDDINGS = 2048

# Gemma 3 VLM: 32x32 images in 8x8 patches give a 4x4 patch grid; the projector average-pools it to
# sqrt(mm_tokens_per_image) per side (the real model: 64x64 patches pooled 4x4 to 16x16 = 256 tokens), so 4 image
# tokens per image with a 2x2 pooling kernel.
GEMMA3_IMAGE_SIZE = 32
GEMMA3_PATCH_SIZE = 8
GEMMA3_MM_TOKENS_PER_IMAGE = 4
# Gemma 3's image tokens, appended after the tiny SentencePiece vocabulary (the real ones: 255999, 256000, 262144).
GEMMA3_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
# Gemma 3's turn format with content given as a string or as a list of {"type": "image"} / {"type": "text"} parts;
# an image part becomes <start_of_image>, which the processor expands into the image token sequence.
GEMMA3_VLM_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

BERT_LABELS = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_VOCAB_SIZE = 512


def _pad_to(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def _seed_weights(model, seed: int) -> None:
    """Redraw every parameter from one seeded generator, in the model's parameter order.

    Matrices, embeddings, routers and experts N(0, 0.02); biases 0; norm weights at their neutral value (1, or 0
    for Gemma's norms, which scale by 1 + weight). Buffers (RoPE frequencies, position ids) are computed, not drawn.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    norm_weights = {}
    for module_name, module in model.named_modules():
        kind = type(module).__name__
        if "Norm" in kind and getattr(module, "weight", None) is not None:
            prefix = f"{module_name}." if module_name else ""
            norm_weights[f"{prefix}weight"] = 0.0 if kind.startswith("Gemma") else 1.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in norm_weights:
                param.fill_(norm_weights[name])
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(
                    torch.empty(param.shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=generator)
                )


def _save_model(model, out: Path) -> None:
    model.save_pretrained(out, safe_serialization=True)
    for path in out.iterdir():
        path.chmod(0o644)  # readable by other users (pods), like the rest of the folder


def _build_qwen3_moe(out: Path, seed: int) -> None:
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from kfp_finetune.tiny.tokenizer import write_tokenizer

    tokens = write_tokenizer(out, "qwen3")
    endoftext, im_end = tokens.special_tokens["<|endoftext|>"], tokens.special_tokens["<|im_end|>"]
    config = Qwen3MoeConfig(
        vocab_size=_pad_to(tokens.num_tokens),  # Qwen pads its embedding to a multiple of 64
        hidden_size=64,
        intermediate_size=128,  # dense MLP size, unused while every layer is sparse
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,  # as Qwen3-30B-A3B
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="float32",
    )
    model = Qwen3MoeForCausalLM(config)
    _seed_weights(model, seed)
    # Qwen3's generation_config.json: stop on <|im_end|> or <|endoftext|>, pad with <|endoftext|>.
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext, do_sample=False
    )
    _save_model(model, out)


def _gemma3_tokenizer():
    """The tiny Gemma 3 tokenizer as a `GemmaTokenizer` (tokenizer.json) with the image tokens added.

    transformers reads a bare tokenizer.model through protobuf (which may not match its generated code), so the
    SentencePiece vocabulary is turned into the BPE that Gemma's tokenizer.json holds: the pieces in id order, and
    for each piece every split into two known pieces as a merge, ranked by the piece's id.
    """
    import tempfile

    import sentencepiece
    from transformers import AddedToken, GemmaTokenizer

    from kfp_finetune.tiny.tokenizer import _write_gemma3_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tokens = _write_gemma3_tokenizer(Path(tmp))
        config = json.loads((Path(tmp) / "tokenizer_config.json").read_text())
        sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(tmp) / "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    plain = {p for p, i in vocab.items() if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))}
    plain -= set(config["additional_special_tokens"])
    merges = [
        (piece[:k], piece[k:])
        for piece in sorted(plain, key=vocab.get)
        for k in range(1, len(piece))
        if piece[:k] in plain and piece[k:] in plain
    ]
    tokenizer = GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        model_max_length=config["model_max_length"],
        clean_up_tokenization_spaces=False,
        extra_special_tokens=dict(GEMMA3_IMAGE_TOKENS),  # named: the processor reads tokenizer.boi_token etc.
    )
    # <start_of_turn>, <end_of_turn> (user-defined symbols in the SentencePiece model), then the image tokens
    # after the vocabulary, in a fixed order.
    tokenizer.add_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t in [*config["additional_special_tokens"], *GEMMA3_IMAGE_TOKENS.values()]
        ],
        special_tokens=True,
    )
    return tokenizer, tokens


def _build_gemma3_vlm(out: Path, seed: int) -> None:
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        GenerationConfig,
    )

    tokenizer, tokens = _gemma3_tokenizer()
    image_ids = {name: tokenizer.convert_tokens_to_ids(t) for name, t in GEMMA3_IMAGE_TOKENS.items()}
    specials = tokens.special_tokens
    config = Gemma3Config(
        text_config={
            "vocab_size": _pad_to(len(tokenizer)),  # the real model: 262144 tokens padded to 262208
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "bos_token_id": specials["<bos>"],
            "eos_token_id": [specials["<eos>"], specials["<end_of_turn>"]],
            "pad_token_id": specials["<pad>"],
        },
        vision_config={
            "model_type": "siglip_vision_model",
            "image_size": GEMMA3_IMAGE_SIZE,
            "patch_size": GEMMA3_PATCH_SIZE,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vision_use_head": False,  # Gemma 3 takes the patch embeddings, not a pooled one
        },
        mm_tokens_per_image=GEMMA3_MM_TOKENS_PER_IMAGE,
        boi_token_index=image_ids["boi_token"],
        eoi_token_index=image_ids["eoi_token"],
        image_token_index=image_ids["image_token"],
        bos_token_id=specials["<bos>"],
        eos_token_id=[specials["<eos>"], specials["<end_of_turn>"]],
        pad_token_id=specials["<pad>"],
        dtype="float32",
    )
    model = Gemma3ForConditionalGeneration(config)
    _seed_weights(model, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=specials["<bos>"],
        eos_token_id=[specials["<eos>"], specials["<end_of_turn>"]],
        pad_token_id=specials["<pad>"],
        do_sample=False,
    )
    _save_model(model, out)
    image_processor = Gemma3ImageProcessorPil(
        size={"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE},
        do_pan_and_scan=False,
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_VLM_CHAT_TEMPLATE,
        image_seq_length=GEMMA3_MM_TOKENS_PER_IMAGE,
    )
    processor.save_pretrained(out)


def _bert_tokenizer():
    """A lower-casing WordPiece tokenizer (BERT's normalizer and pre-tokenizer) with a vocabulary from the tiny corpus.

    The vocabulary is counted here rather than by `tokenizers`' WordPieceTrainer: that trainer orders the `##`
    pieces by a per-process hash, which changes which merges win ties, so its vocabulary differs from run to run.
    Here: the special tokens, every character (alone and as a `##` continuation), then whole words by frequency
    (ties alphabetical), up to BERT_VOCAB_SIZE. Words outside it split into characters, as WordPiece does.
    """
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers
    from transformers import BertTokenizer

    from kfp_finetune.tiny.tokenizer import training_corpus

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(
        word
        for line in training_corpus()
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line))
    )
    chars = sorted({c for word in words for c in word})
    continuations = sorted({f"##{c}" for word in words for c in word[1:]})
    pieces = [*BERT_SPECIAL_TOKENS, *chars, *continuations]
    by_frequency = sorted((w for w in words if len(w) > 1), key=lambda w: (-words[w], w))
    pieces += by_frequency[: BERT_VOCAB_SIZE - len(pieces)]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    return BertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=512)


def _build_bert_classifier(out: Path, seed: int) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = _bert_tokenizer()
    tokenizer.save_pretrained(out)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=len(BERT_LABELS),
        id2label=dict(enumerate(BERT_LABELS)),
        label2id={label: i for i, label in enumerate(BERT_LABELS)},
        problem_type="single_label_classification",
        dtype="float32",
    )
    model = BertForSequenceClassification(config)
    _seed_weights(model, seed)
    _save_model(model, out)


_BUILDERS = {
    "qwen3_moe": _build_qwen3_moe,
    "gemma3_vlm": _build_gemma3_vlm,
    "bert_classifier": _build_bert_classifier,
}


def build_tiny_hf_model(out_dir: str | Path, kind: str, seed: int = 0) -> Path:
    """Write the tiny HF model folder of `kind` (one of KINDS) into `out_dir` and return the directory.

    Same arguments give byte-identical files; the tokenizer / processor files depend only on the kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _BUILDERS[kind](out, seed)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="output directory")
    parser.add_argument("--kind", choices=KINDS, default="qwen3_moe")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    print(build_tiny_hf_model(args.out, kind=args.kind, seed=args.seed))
    return 0
