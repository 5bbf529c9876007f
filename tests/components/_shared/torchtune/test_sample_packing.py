"""No training target crosses a sample boundary in a pack (sample_packing.py): the loss of packed batches, computed
as torchtune 0.6.1's recipes compute it (labels shifted over the whole pack, cross-entropy with ignore_index -100,
summed over targets), equals the sum of each sample's loss computed alone, on text-completion data and on instruct
data with the prompt trained on (the two where a sample's first label is trained), for dataset-initialize's packs
and for torchtune's packing as a resolved run names it. Batches go through torchtune's packed collate, whose
block-causal document mask and per-sample input_pos let the model see each sample alone."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torchtune")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kfp_finetune.components._shared.torchtune import sample_packing  # noqa: E402
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig  # noqa: E402
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir  # noqa: E402
from kfp_finetune.components._shared.torchtune.pack_file import ArrowPacks  # noqa: E402
from kfp_finetune.components._shared.torchtune.packing import pack_split, sft_node, tokenize  # noqa: E402
from kfp_finetune.components._shared.torchtune.resolve import resolve_run  # noqa: E402

IGNORE = -100
WORDS = ["cat", "dog", "a", "b", "sky", "blue", "tree", "runs", "over", "the"]
SAMPLES_PER_PACK = 3
TEXT_ROWS = 12
INSTRUCT_ROWS = 40
INSTRUCT_MAX_SEQ_LEN = 64
HINTS = {
    "text": {"dataset_type": "text", "data_style": "text", "text_column": "text"},
    "instruct": {"dataset_type": "instruct", "data_style": "input_output"},
}


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _text_rows(tokenizer_node: dict, tmp_path) -> tuple[list[dict], int]:
    """Rows of one token length n, and 3n as max_seq_len: text packs split rows across packs (torchtune's default
    for text completion), and a split row's remainder is not that row alone; here every pack holds three whole
    rows."""
    rng = random.Random(0)
    candidates = [{"text": _words(rng, rng.randint(3, 9))} for _ in range(400)]
    path = tmp_path / "candidates.parquet"
    pq.write_table(pa.Table.from_pylist(candidates), path)
    lengths = tokenize(tokenizer_node, sft_node(HINTS["text"], [str(path)])).lengths().tolist()
    common = max(set(lengths), key=lengths.count)
    rows = [row for row, n in zip(candidates, lengths, strict=True) if n == common][:TEXT_ROWS]
    assert len(rows) == TEXT_ROWS
    return rows, SAMPLES_PER_PACK * common


def _instruct_rows() -> list[dict]:
    rng = random.Random(1)
    return [
        {"input": _words(rng, rng.randint(1, 6)), "output": _words(rng, rng.randint(1, 6))}
        for _ in range(INSTRUCT_ROWS)
    ]


@pytest.fixture(params=[("text", "tiny_llama"), ("instruct", "tiny_qwen")], ids=["text", "instruct"])
def data(request, tmp_path):
    """(kind, model folder, parquet file, the dataset node of sft_node, max_seq_len), rows whose first label is
    trained: text completion trains every token; on instruct data with the prompt trained on, Qwen's first token
    is trained (Llama 3's tokenizer never trains its BOS)."""
    kind, model_fixture = request.param
    model_dir = request.getfixturevalue(model_fixture)
    tokenizer_node = inspect_model_dir(model_dir).tokenizer_node(None)
    if kind == "text":
        rows, max_seq_len = _text_rows(tokenizer_node, tmp_path)
    else:
        rows, max_seq_len = _instruct_rows(), INSTRUCT_MAX_SEQ_LEN
    path = tmp_path / "train" / "part-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    node = sft_node(HINTS[kind], [str(path)], train_on_input=True)
    return kind, model_dir, path, node, max_seq_len


def recipe_loss(model, batch: dict) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy and number of targets, as torchtune 0.6.1's recipes shift (`_loss_step`)."""
    labels = batch["labels"]
    with torch.no_grad():
        logits = model(batch["tokens"], mask=batch.get("mask"), input_pos=batch.get("input_pos"))
    targets = torch.hstack((labels[..., 1:], torch.full((labels.shape[0], 1), IGNORE)))
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return loss, int((targets != IGNORE).sum())


def packed_loss(model, packs) -> tuple[torch.Tensor, int]:
    from torchtune.data import padded_collate_packed

    total, targets = torch.zeros((), dtype=torch.float64), 0
    for first in range(0, len(packs), 2):  # batches of two packs, as the recipe's DataLoader collates them
        batch = padded_collate_packed([packs[i] for i in range(first, min(first + 2, len(packs)))])
        loss, count = recipe_loss(model, batch)
        total, targets = total + loss, targets + count
    return total, targets


def unpacked_loss(model, samples) -> tuple[torch.Tensor, int]:
    total, targets = torch.zeros((), dtype=torch.float64), 0
    for sample in samples:
        batch = {"tokens": torch.tensor([sample["tokens"]]), "labels": torch.tensor([sample["labels"]])}
        loss, count = recipe_loss(model, batch)
        total, targets = total + loss, targets + count
    return total, targets


def torchtune_side(model_dir, kind: str, path, max_seq_len: int, tmp_path):
    """The packs and the tokenizer a CPU run resolved with packing instantiates (as the recipe builds them)."""
    cfg = TorchtuneConfig(
        method="full",
        device="cpu",
        packed=True,
        max_seq_len=max_seq_len,
        epochs=1,
        batch_size=2,
        gradient_accumulation_steps=1,
    )  # a short run, accepted as one (run_length.py)
    cfg.dataset.dataset_type = kind
    cfg.dataset.train_on_input = True if kind == "instruct" else None
    run = resolve_run(cfg, model_dir, path, tmp_path / "run", validate=True)
    assert run.config["dataset"]["_component_"] == sample_packing.COMPONENT
    tokenizer = instantiate(run.config["tokenizer"])
    return instantiate(run.config["dataset"], tokenizer), tokenizer


def instantiate(node: dict, *args):
    from omegaconf import OmegaConf
    from torchtune import config

    return config.instantiate(OmegaConf.create(node), *args)


@pytest.mark.slow
def test_packed_loss_is_the_sum_of_the_samples_losses(data, tmp_path):
    from kfp_finetune.components._shared.torchtune.evaluation import load_model

    kind, model_dir, path, node, max_seq_len = data
    model = load_model(inspect_model_dir(model_dir), torch.device("cpu"), torch.float64)
    tokenizer_node = inspect_model_dir(model_dir).tokenizer_node(None)
    written = pack_split(tokenizer_node, node, tmp_path / "packs", max_seq_len=max_seq_len)
    assert written.unfit_rows == [] and written.truncated_rows == 0
    packs, tokenizer = torchtune_side(model_dir, kind, path, max_seq_len, tmp_path)
    samples = instantiate({**node, "packed": False}, tokenizer)  # torchtune's builder, row by row
    # Every sample's first label is trained: packed the old way, each boundary would add one target.
    assert all(samples[i]["labels"][0] != IGNORE for i in range(len(samples)))
    alone, alone_targets = unpacked_loss(model, (samples[i] for i in range(len(samples))))
    for made in (ArrowPacks([written.path]), packs):
        assert 1 < len(made) < len(samples)  # several packs of several samples each
        loss, targets = packed_loss(model, made)
        assert targets == alone_targets
        # float64 weights; torchtune's RMSNorm computes in float32: a relative 1e-6 holds, one target more not
        torch.testing.assert_close(loss, alone, rtol=1e-6, atol=0)
