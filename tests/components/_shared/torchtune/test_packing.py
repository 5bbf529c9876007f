"""Packs written once on CPU equal the fine-tune step's own packing (each sample's first label ignored:
torchtune/sample_packing.py), token for token, on all three dataset types, with the default masking and with the
prompt trained on / a new system prompt; each pack is laid out as torchtune's PackedDataset lays out its rows
(bin_packing.py chooses the rows); the loss over the packs is the loss over the rows unpacked."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torchtune")

from kfp_finetune.components._shared.bin_packing import plan_packs  # noqa: E402
from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len  # noqa: E402
from kfp_finetune.components._shared.torchtune import sample_packing  # noqa: E402
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir, instantiate  # noqa: E402
from kfp_finetune.components._shared.torchtune.pack_file import ArrowPacks  # noqa: E402
from kfp_finetune.components._shared.torchtune.packing import (  # noqa: E402
    length_stats,
    pack_fingerprint,
    pack_key,
    pack_split,
    sft_node,
    tokenize,
)

ROWS = 240


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(["cat", "dog", "a", "b", "sky", "blue", "tree"]) for _ in range(n))


def _lengths(rng: random.Random) -> int:
    # long-tailed: most short, a few far longer than the pack (cut by the tokenizer, split across packs)
    return rng.choice([2, 3, 5, 8, 13]) if rng.random() < 0.95 else rng.randint(60, 120)


def _rows(kind: str) -> list[dict]:
    rng = random.Random(kind)
    rows = []
    for _ in range(ROWS):
        q, a = _words(rng, _lengths(rng)), _words(rng, _lengths(rng))
        if kind == "instruct":
            rows.append({"input": q, "output": a})
        elif kind == "chat":
            turns = [{"role": "system", "content": "be brief"}] if rng.random() < 0.5 else []
            turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            rows.append({"messages": turns})
        else:
            rows.append({"text": f"{q} {a}"})
    return rows


HINTS = {
    "instruct": {"dataset_type": "instruct", "data_style": "input_output"},
    "chat": {"dataset_type": "chat", "data_style": "openai", "conversation_style": "openai",
             "conversation_column": "messages"},
    "text": {"dataset_type": "text", "data_style": "text", "text_column": "text"},
}  # fmt: skip


@pytest.fixture
def split(request, tmp_path):
    """(kind, the dataset node, the masking): `request.param` is a kind, or (kind, sft_node's masking arguments)."""
    kind, masking = request.param if isinstance(request.param, tuple) else (request.param, {})
    path = tmp_path / "train" / "part-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(_rows(kind)), path)
    return kind, sft_node(HINTS[kind], [str(path)], **masking), masking


def _torchtune_packs(tokenizer_node: dict, node: dict, max_seq_len: int):
    """torchtune's packs, and the fine-tune step's (the node a resolved run names when torchtune packs). Whole
    rows: torchtune's PackedDataset over each planned pack's rows (one pack each), in the plan's order."""
    from torchtune.datasets import PackedDataset

    tokenizer = instantiate({**tokenizer_node, "max_seq_len": max_seq_len})
    theirs = instantiate({**sample_packing.wrap({**node, "packed": True}), "tokenizer": tokenizer})
    if node["_component_"].endswith("text_completion_dataset"):  # rows flow over packs: torchtune's own loop
        return instantiate({**node, "packed": True, "tokenizer": tokenizer}), theirs
    rows = instantiate({**node, "packed": False, "tokenizer": tokenizer})
    plan = plan_packs([len(row["tokens"]) for row in rows], max_seq_len)
    torchtunes = []
    for a, b in zip(plan.bounds[:-1], plan.bounds[1:], strict=True):
        (pack,) = PackedDataset([rows[i] for i in plan.order[a:b].tolist()], max_seq_len=max_seq_len)
        torchtunes.append(pack)
    return torchtunes, theirs


def _without(node: dict, rows: list[int], tmp_path) -> dict:
    """The node over a copy of its parquet data without `rows`."""
    table = pq.read_table(node["data_files"][0])
    kept = tmp_path / "kept.parquet"
    pq.write_table(table.take([i for i in range(table.num_rows) if i not in set(rows)]), kept)
    return {**node, "data_files": [str(kept)]}


# Text completion takes neither train_on_input nor new_system_prompt (torchtune 0.6's text_completion_dataset).
TRAIN_ON_INPUT = {"train_on_input": True}
SYSTEM_PROMPT = {"train_on_input": True, "new_system_prompt": "Answer in the words of the question."}


@pytest.mark.parametrize(
    "split",
    ["instruct", "chat", "text", ("instruct", TRAIN_ON_INPUT), ("chat", TRAIN_ON_INPUT),
     ("instruct", SYSTEM_PROMPT), ("chat", SYSTEM_PROMPT)],
    indirect=True,
)  # fmt: skip
@pytest.mark.slow
def test_packs_equal_torchtune_packing(split, tiny_llama, tmp_path):
    import torch

    kind, node, masking = split
    tokenizer_node = inspect_model_dir(tiny_llama).tokenizer_node(None)
    if masking.get("train_on_input"):  # the masking reached the builder: fewer labels ignored than without it

        def ignored(n: dict) -> int:
            return int((tokenize(tokenizer_node, n).labels == -100).sum())

        assert ignored(node) < ignored({**node, "train_on_input": False})
    max_seq_len = 48
    result = pack_split(tokenizer_node, node, tmp_path / "packs", max_seq_len=max_seq_len, num_proc=2)
    ours = ArrowPacks([result.path])
    # Rows whose masked prompt fills the length are left out (they would train nothing): torchtune packs the rest.
    assert bool(result.unfit_rows) == (kind != "text" and not masking.get("train_on_input"))
    torchtunes, theirs = _torchtune_packs(
        tokenizer_node, _without(node, result.unfit_rows, tmp_path), max_seq_len
    )
    assert result.truncated_rows > 0  # the long rows went through the cut-again path
    assert len(ours) == len(theirs) == len(torchtunes) == result.num_packs > 1
    for i in range(len(theirs)):
        for key in ("tokens", "labels", "input_pos", "seq_lens"):
            assert ours[i][key].dtype == theirs[i][key].dtype == torch.long
            assert torch.equal(ours[i][key], theirs[i][key]), (kind, i, key)
        # torchtune's packing, but for the labels at the samples' first positions, now ignored
        starts = sample_packing.sample_starts(ours[i]["seq_lens"])
        labels = torchtunes[i]["labels"].clone()
        labels[starts] = -100
        assert torch.equal(ours[i]["labels"], labels), (kind, i)
        for key in ("tokens", "input_pos", "seq_lens"):
            assert torch.equal(ours[i][key], torchtunes[i][key]), (kind, i, key)


@pytest.mark.parametrize("split", ["instruct"], indirect=True)
def test_max_seq_len_from_the_tokenized_lengths(split, tiny_llama, tmp_path):
    _, node, _ = split
    tokenizer_node = inspect_model_dir(tiny_llama).tokenizer_node(None)
    tokenized = tokenize(tokenizer_node, node, num_proc=1)
    lengths = tokenized.lengths().tolist()
    stats = length_stats(tokenized)
    assert (
        stats["count"] == ROWS and stats["max"] == max(lengths) > stats["p99"] >= stats["p90"] >= stats["p50"]
    )
    assert 0 < stats["prompt_max"] < stats["max"]
    result = pack_split(tokenizer_node, node, tmp_path / "p", max_position_embeddings=131072)
    assert result.max_seq_len == choose_max_seq_len(lengths, 131072)
    assert result.max_seq_len % 256 == 0 and result.num_packs < ROWS
    assert result.stats == stats


def test_a_long_prompt_does_not_raise_the_pack_length_and_is_left_out_and_counted(tiny_llama, tmp_path):
    """One row in a hundred has a prompt longer than the 99th percentile's length: the packs keep the percentile
    rule's length (the same rule, from the same figures, as the fine-tune step's default: test_defaults.py), and
    the row, which would train nothing once cut, is left out of them and reported."""
    from tests.support.long_prompt import LONG_ROW, ROWS, long_prompt_rows

    path = tmp_path / "train" / "part-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(long_prompt_rows()), path)
    node = sft_node(HINTS["instruct"], [str(path)])
    tokenizer_node = inspect_model_dir(tiny_llama).tokenizer_node(None)
    tokenized = tokenize(tokenizer_node, node, num_proc=1)
    lengths = tokenized.lengths().tolist()
    # prompt_max is the longest prompt: the tokens before the long row's first trained one (not every masked
    # token: the row's final EOS is masked too).
    labels = tokenized.labels[tokenized.offsets[LONG_ROW] : tokenized.offsets[LONG_ROW + 1]].tolist()
    prompt = next(i for i, label in enumerate(labels) if label != -100)
    stats = length_stats(tokenized)
    assert (
        stats["prompt_max"] == prompt == labels.count(-100) - 1 > 256 == choose_max_seq_len(lengths, 131072)
    )
    result = pack_split(tokenizer_node, node, tmp_path / "p", max_position_embeddings=131072)
    assert result.max_seq_len == 256
    assert result.unfit_rows == [LONG_ROW] and result.unfit_needed == len(labels)
    packs = ArrowPacks([result.path])
    packed = sum(int((packs[i]["labels"] != -100).sum()) for i in range(len(packs)))
    trained = [
        int((tokenized.labels[tokenized.offsets[r] : tokenized.offsets[r + 1]] != -100).sum())
        for r in range(ROWS)
    ]
    assert packed == sum(trained) - trained[LONG_ROW]  # every other row whole, the long one left out
    with_it = pack_split(tokenizer_node, node, tmp_path / "q", max_seq_len=1024)
    assert with_it.unfit_rows == [] and with_it.max_seq_len == 1024  # a length that holds it keeps it


@pytest.mark.parametrize("split", ["instruct"], indirect=True)
def test_fingerprint_changes_with_tokenizer_template_and_length(split, tiny_llama, tiny_qwen):
    _, node, _ = split
    llama = inspect_model_dir(tiny_llama).tokenizer_node(None)
    qwen = inspect_model_dir(tiny_qwen).tokenizer_node(None)
    same = pack_fingerprint(llama, node, 256)
    assert pack_fingerprint(llama, {**node, "data_files": ["elsewhere.parquet"]}, 256) == same
    assert pack_fingerprint(qwen, node, 256) != same
    assert pack_fingerprint(llama, {**node, "train_on_input": True}, 256) != same
    assert pack_fingerprint(llama, {**node, "new_system_prompt": "x"}, 256) != same
    assert pack_fingerprint(llama, node, 512) != same


def test_a_new_pack_format_keys_new_folders_and_fingerprints(monkeypatch):
    """Packs written before a format change (e.g. what prompt_max counts, sample starts ignored) are not found and
    reused, nor trained on by a run that finds them in a split's metadata."""
    from kfp_finetune.components._shared.torchtune import packing

    node = sft_node(HINTS["instruct"], ["train.parquet"])
    tokenizer = {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "tokenizer.model"}
    before, fingerprint = pack_key("tokenizer", node, None), pack_fingerprint(tokenizer, node, 256)
    assert pack_key("tokenizer", {**node, "data_files": ["elsewhere.parquet"]}, None) == before
    monkeypatch.setattr(packing, "PACK_FORMAT", packing.PACK_FORMAT + 1)
    assert pack_key("tokenizer", node, None) != before
    assert pack_fingerprint(tokenizer, node, 256) != fingerprint


def test_the_node_takes_masking_where_the_builder_does(tmp_path):
    files = [str(tmp_path / "train.parquet")]
    for kind in ("instruct", "chat"):
        node = sft_node(HINTS[kind], files, train_on_input=True, new_system_prompt="be brief")
        assert (node["train_on_input"], node["new_system_prompt"]) == (True, "be brief")
        assert "new_system_prompt" not in sft_node(HINTS[kind], files)
    text = sft_node(HINTS["text"], files, train_on_input=True, new_system_prompt="be brief")
    assert "train_on_input" not in text and "new_system_prompt" not in text
    alpaca = {"dataset_type": "instruct", "data_style": "alpaca"}
    assert sft_node(alpaca, files, train_on_input=True)["train_on_input"] is True
    with pytest.raises(ValueError, match="new_system_prompt is not supported for alpaca"):
        sft_node(alpaca, files, new_system_prompt="be brief")


def _summed_loss(model, tokens, labels, **inputs) -> tuple[float, int]:
    """The summed cross-entropy and the number of targets, labels shifted as torchtune's recipes shift them."""
    import torch
    import torch.nn.functional as F

    targets = torch.hstack([labels[:, 1:], torch.full_like(labels[:, :1], -100)])
    logits = model(tokens, **inputs).float()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
    return float(loss), int((targets != -100).sum())


@pytest.mark.parametrize("split", ["instruct", "chat", ("chat", TRAIN_ON_INPUT)], indirect=True)
def test_the_loss_over_the_packs_is_the_loss_over_the_rows(split, tiny_llama, tmp_path):
    """A tiny model's per-token loss over packed batches (collated as the recipe collates them: attention masked
    to each row by seq_lens) is its loss over every row alone: every trained token once, with its own row's
    context. test_sample_packing.py holds the same on rows whose first label is trained."""
    import torch
    from torchtune.data import padded_collate_packed

    from kfp_finetune.components._shared.torchtune import builder_nodes

    _, node, _ = split
    model_dir = inspect_model_dir(tiny_llama)
    max_seq_len = 48
    result = pack_split(model_dir.tokenizer_node(None), node, tmp_path / "packs", max_seq_len=max_seq_len)
    packs = ArrowPacks([result.path])
    tokenizer = instantiate({**model_dir.tokenizer_node(None), "max_seq_len": max_seq_len})
    rows = instantiate({**_without(node, result.unfit_rows, tmp_path), "tokenizer": tokenizer})
    model_node = model_dir.model_node()
    torch.manual_seed(0)
    model = builder_nodes.builder(model_node["_component_"])(
        **{k: v for k, v in model_node.items() if k != "_component_"}
    ).eval()
    packed, trained = 0.0, 0
    with torch.no_grad():
        for first in range(0, len(packs), 4):
            batch = padded_collate_packed([packs[i] for i in range(first, min(first + 4, len(packs)))])
            loss, count = _summed_loss(
                model, batch["tokens"], batch["labels"], mask=batch["mask"], input_pos=batch["input_pos"]
            )
            packed, trained = packed + loss, trained + count
        unpacked, targets = 0.0, 0
        for row in rows:
            loss, count = _summed_loss(model, torch.tensor([row["tokens"]]), torch.tensor([row["labels"]]))
            unpacked, targets = unpacked + loss, targets + count
    assert len(packs) < len(rows) and trained == targets > 0
    assert packed / trained == pytest.approx(unpacked / targets, rel=1e-5)


@pytest.mark.parametrize("split", ["instruct"], indirect=True)
def test_the_same_rows_give_the_same_packs(split, tiny_llama, tmp_path):
    import torch

    _, node, _ = split
    tokenizer_node = inspect_model_dir(tiny_llama).tokenizer_node(None)
    first, again = (
        ArrowPacks([pack_split(tokenizer_node, node, tmp_path / name, max_seq_len=48, num_proc=n).path])
        for name, n in (("one", 1), ("two", 2))
    )
    assert len(first) == len(again) > 1
    for i in range(len(first)):
        assert all(
            torch.equal(first[i][k], again[i][k]) for k in ("tokens", "labels", "input_pos", "seq_lens")
        )
