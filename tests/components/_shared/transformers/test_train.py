"""Real TRL fine-tunes of the tiny Qwen3-MoE on CPU (components/_shared/transformers/train.py), offline: LoRA for 20
steps (loss falls, the adapter and the merged folder agree, only the adapted weights change), the prompt masked out
of the loss, a full fine-tune, the metrics file, the face's run-folder readers, and the same losses for the same
seed. One LoRA run is shared by most tests (module scope)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kfp_finetune.components._shared.metrics_file import read_metrics_file, read_resume_points
from kfp_finetune.components._shared.stop_exit import OWN_POD_STOPPING
from kfp_finetune.components._shared.transformers import face, run_layout, run_length, train
from kfp_finetune.components._shared.transformers.rows import ASSISTANT_TURNS, chat_loss_mode, load_rows
from kfp_finetune.components._shared.transformers.settings import SftSettings

pytest.importorskip("trl")
pytestmark = pytest.mark.slow

LORA_STEPS = 20
ADAPTED = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
)  # what all-linear reaches in Qwen3-MoE: experts are 3D params


@pytest.fixture(scope="module", autouse=True)
def offline_and_one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    root = tmp_path_factory.mktemp("trl")
    build_tiny_hf_model(root / "base", "qwen3_moe")
    build_tiny_dataset(root / "data", train_rows=160, eval_rows=1)
    return root


def settings_for(root: Path, run: str, **changes) -> SftSettings:
    values = dict(
        model_dir=str(root / "base"),
        data_files=[str(root / "data" / "train.parquet")],
        output_dir=str(root / run),
        max_steps=LORA_STEPS,
        batch_size=4,
        learning_rate=3e-3,
        lora_rank=8,
        lora_alpha=16.0,
        max_seq_len=64,
        seed=3,
    )
    return SftSettings(**{**values, **changes})


@pytest.fixture(scope="module")
def lora_run(root) -> Path:
    summary = train.train(settings_for(root, "lora"))
    assert summary["global_step"] == LORA_STEPS
    return Path(summary["run_dir"])


def tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        found.update(load_file(path))
    return found


def test_lora_loss_falls_and_the_metrics_file_parses(lora_run):
    steps = read_metrics_file(lora_run / run_layout.METRICS_FILE)
    assert [s.step for s in steps] == list(range(1, LORA_STEPS + 1))
    assert all(s.loss is not None and s.values["lr"] > 0 for s in steps)
    assert all(s.tokens_per_second and s.tokens_per_second > 0 for s in steps)
    first, last = [s.loss for s in steps[:3]], [s.loss for s in steps[-3:]]
    assert sum(last) / 3 < sum(first) / 3 - 0.1, [s.loss for s in steps]


def test_the_run_folder_has_the_adapter_the_merged_model_and_the_resolved_config(lora_run, root):
    adapter = face.last_adapter_state(lora_run)
    assert adapter == lora_run / run_layout.ADAPTER_DIR
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(root / "base") and config["r"] == 8
    resolved = face.read_resolved_config(lora_run)
    assert resolved["settings"]["method"] == "lora" and resolved["world_size"] == 1
    assert resolved["sft_config"]["completion_only_loss"] is True
    merged = lora_run / run_layout.MERGED_DIR
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in merged.iterdir()
    }
    # Nothing partial or scratch is left beside the outputs.
    assert sorted(p.name for p in lora_run.iterdir()) == ["adapter", "logs", "merged", "trl_config.json"]


def test_lora_changed_only_the_adapted_weights(lora_run, root):
    import torch

    adapter = tensors(lora_run / run_layout.ADAPTER_DIR)
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # PEFT starts B at zero: training moved it
    assert {name.split(".")[-3] for name in adapter} == set(ADAPTED)

    base, merged = tensors(root / "base"), tensors(lora_run / run_layout.MERGED_DIR)
    assert base.keys() == merged.keys()
    changed = {name for name in base if not torch.equal(base[name], merged[name])}
    assert changed and {name.split(".")[-2] for name in changed} == set(ADAPTED)
    experts = [name for name in base if ".mlp." in name]  # the experts and the router: not adapted
    assert experts and not changed & set(experts)


def test_the_adapter_on_the_base_gives_the_merged_models_logits(lora_run, root):
    assert_adapter_matches_merged(lora_run, root)


def assert_adapter_matches_merged(run: Path, root: Path) -> None:
    """The adapter loaded with PEFT onto the base gives the merged folder's logits; both load offline."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged_dir = run / run_layout.MERGED_DIR
    tokenizer = AutoTokenizer.from_pretrained(merged_dir, local_files_only=True)
    ids = tokenizer("Uppercase: q u i z", return_tensors="pt").input_ids
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, local_files_only=True).eval()
    base = AutoModelForCausalLM.from_pretrained(root / "base", local_files_only=True)
    adapted = PeftModel.from_pretrained(base, run / run_layout.ADAPTER_DIR).eval()
    with torch.no_grad():
        expected, got = merged(ids).logits, adapted(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(root / "base", local_files_only=True).eval()(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the adapter does something


@pytest.mark.filterwarnings(
    "ignore:Unsupported layer type"
)  # PEFT's word for a 3D-parameter target: expected
def test_lora_on_the_expert_parameters_reaches_the_experts(root):
    """target_parameters puts LoRA on Qwen3-MoE's 3D expert weights, which all-linear does not reach."""
    import torch

    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    summary = train.train(settings_for(root, "experts", max_steps=3, target_parameters=experts))
    run = Path(summary["run_dir"])
    base, merged = tensors(root / "base"), tensors(run / run_layout.MERGED_DIR)
    changed = {name for name in base if not torch.equal(base[name], merged[name])}
    assert any(".experts." in name for name in changed)
    assert not {name for name in changed if "mlp.gate." in name or "embed" in name or "lm_head" in name}
    assert_adapter_matches_merged(run, root)


def test_qlora_trains_an_adapter_on_the_4_bit_base_and_merges_it_into_the_full_precision_one(root):
    """tune_method=qlora (KEP-2401's quantize_base): the base's linear layers train as bitsandbytes' 4-bit NF4 with
    the adapter beside them in full precision; the adapter is merged into the base read afresh, so the merged
    folder carries no 4-bit rounding, and PEFT's adapter on the base gives its logits."""
    bnb = pytest.importorskip("bitsandbytes")

    settings = settings_for(root, "qlora", method="qlora", device="cpu")
    quantized = [m for m in train.build_trainer(settings).model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized, "the base was not loaded in 4 bits"
    run = Path(train.train(settings_for(root, "qlora-run", method="qlora", device="cpu"))["run_dir"])
    base, merged = tensors(root / "base"), tensors(run / run_layout.MERGED_DIR)
    assert {name: tensor.dtype for name, tensor in merged.items()} == {
        name: t.dtype for name, t in base.items()
    }
    assert_adapter_matches_merged(run, root)


def test_dora_trains_a_magnitude_beside_the_adapter_and_merges_both(root):
    """tune_method=dora (torchtune's dora, PEFT's use_dora): the adapter learns each weight's magnitude beside its
    low-rank direction, and the merged folder gives the logits of PEFT's DoRA adapter on the base."""
    from safetensors.torch import load_file

    run = Path(train.train(settings_for(root, "dora", method="dora"))["run_dir"])
    adapter = load_file(run / run_layout.ADAPTER_DIR / "adapter_model.safetensors")
    assert any("lora_magnitude_vector" in name for name in adapter), sorted(adapter)[:5]
    assert json.loads((run / run_layout.ADAPTER_DIR / "adapter_config.json").read_text())["use_dora"] is True
    assert_adapter_matches_merged(run, root)


def test_rows_whose_prompt_fills_max_seq_len_are_said_and_too_many_are_refused_before_training(
    root, tmp_path, log_lines
):
    """TRL drops the rows its cut at max_length leaves with no trained token: one of 61 is said in the step log and
    the run trains on; three of 63 (more than 1%, unfit_rows.py) refuse the run before its first step, with the fix."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kfp_finetune.components._shared.errors import ConfigError

    def rows_with(long_prompts: int) -> str:
        rows = [{"input": f"Reverse {i}.", "output": str(i)[::-1]} for i in range(100, 160)]
        rows += [{"input": "word " * 200, "output": "x"}] * long_prompts
        path = tmp_path / f"rows-{long_prompts}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        return str(path)

    one = settings_for(root, "one-unfit", data_files=[rows_with(1)], max_steps=2)
    train.train(one)
    said = "1 of 61 training rows train nothing at tune_max_seq_len=64: their prompt fills it"
    assert any(line.startswith(said) and line.endswith("they are left out") for line in log_lines), log_lines
    many = settings_for(root, "many-unfit", data_files=[rows_with(3)], max_steps=2)
    with pytest.raises(
        ConfigError, match=r"^3 of 63 training rows .* \(more than 1% of the rows\): set tune_max_seq_len"
    ):
        train.train(many)
    assert not (Path(many.output_dir) / run_layout.METRICS_FILE).exists(), "training never started"


def test_face_merges_a_run_that_has_only_the_adapter(lora_run, root, tmp_path):
    import torch

    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    shutil.rmtree(run / run_layout.MERGED_DIR)
    merged = face.merged_model_dir(run, root / "base")
    assert merged == run / run_layout.MERGED_DIR
    rebuilt, trained = tensors(merged), tensors(lora_run / run_layout.MERGED_DIR)
    assert all(torch.equal(rebuilt[name], trained[name]) for name in trained)
    stamp = (merged / "model.safetensors").stat().st_mtime_ns
    assert face.merged_model_dir(run, root / "base") == merged  # reused, not rebuilt
    assert (merged / "model.safetensors").stat().st_mtime_ns == stamp


def test_the_prompt_is_masked_out_of_the_loss(root, tmp_path):
    trainer = train.build_trainer(settings_for(root, str(tmp_path / "masking")))
    tokenizer = trainer.processing_class
    rows = [trainer.train_dataset[i] for i in range(2)]
    batch = trainer.data_collator(rows)
    for row, labels in zip(rows, batch["labels"].tolist(), strict=True):
        trained = [t for t in labels if t != -100]
        first = labels.index(trained[0])
        assert labels[:first] == [-100] * first and first > 0
        prompt, answer = tokenizer.decode(row["input_ids"][:first]), tokenizer.decode(trained)
        # The masked part is exactly the user turn and the generation prompt the model sees at inference; the
        # trained part is the answer (after the empty think block Qwen3's template writes) and the end of turn.
        letters = re.search(r"Uppercase: ([a-z](?: [a-z]){3})", prompt).group(1)
        user = [{"role": "user", "content": f"Uppercase: {letters}"}]
        assert prompt == tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        assert answer.removeprefix("<think>\n\n</think>\n\n").startswith(f"{letters.upper()}<|im_end|>"), (
            answer
        )


def test_a_full_fine_tune_changes_the_weights_and_writes_no_adapter(root):
    import torch

    summary = train.train(settings_for(root, "full", method="full", max_steps=3, learning_rate=1e-3))
    run = Path(summary["run_dir"])
    assert face.last_adapter_state(run) is None and "adapter_dir" not in summary
    base, tuned = tensors(root / "base"), tensors(run / run_layout.MERGED_DIR)
    changed = [name for name in base if not torch.equal(base[name], tuned[name].to(base[name].dtype))]
    assert len(changed) > len(base) // 2
    assert any("experts" in name for name in changed)  # a full fine-tune reaches the experts too
    assert len(read_metrics_file(run / run_layout.METRICS_FILE)) == 3


def test_a_full_fine_tune_of_a_bf16_base_is_written_in_bf16(root, tmp_path):
    """A full fine-tune trains fp32 master weights; merged/ is in the base's dtype (the size of the base, and the
    dtype a consumer's from_pretrained(dtype="auto") reads), not twice a bf16 base's size."""
    import torch
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "bf16-base"
    AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.bfloat16).save_pretrained(base_dir)
    run_layout.copy_model_files(root / "base", base_dir)
    summary = train.train(
        settings_for(root, str(tmp_path / "full"), model_dir=str(base_dir), method="full", max_steps=2)
    )
    merged = Path(summary["merged_dir"])
    base, tuned = tensors(base_dir), tensors(merged)
    assert {t.dtype for t in tuned.values()} == {torch.bfloat16}
    assert any(not torch.equal(base[name], tuned[name]) for name in base), "the weights changed"
    size = sum(p.stat().st_size for p in merged.glob("*.safetensors"))
    assert size <= 1.01 * sum(p.stat().st_size for p in base_dir.glob("*.safetensors"))
    assert json.loads((merged / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(merged, dtype="auto").dtype == torch.bfloat16


@pytest.mark.parametrize("method", ["lora", "full"])
def test_under_fsdp2_the_outputs_are_written_from_the_gathered_weights(root, tmp_path, method):
    """Under FSDP2 a process's module holds only its shard of each weight: the outputs are written from the whole
    state gathered to rank 0 (accelerate's get_state_dict: torch's full, CPU-offloaded model state dict), not from
    the module. Here the module's own weights are zeroed after the gathering, as a shard would be wrong."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    run_settings = settings_for(root, str(tmp_path / "run"), method=method, max_steps=2)
    trainer = train.build_trainer(run_settings)
    trainer.train()
    assert train.gathered_state(trainer) is None  # one process holds the whole model: nothing to gather
    model = trainer.accelerator.unwrap_model(trainer.model)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {name: tensor.clone() for name, tensor in get_model_state_dict(model, options=options).items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    train.write_outputs(trainer, run_settings, state)
    written = run_layout.ADAPTER_DIR if method == "lora" else run_layout.MERGED_DIR
    saved = tensors(tmp_path / "run" / written)
    assert saved and all(tensor.count_nonzero() for name, tensor in saved.items() if "lora_B" not in name)
    if method == "full":  # transformers saves fused experts one by one: compared as it loads them back
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / written).state_dict()
        assert set(loaded) == set(state) and all(torch.equal(loaded[name], state[name]) for name in state)


def test_the_same_seed_gives_the_same_losses_through_the_cli(root, tmp_path):
    losses = []
    for name in ("first", "second"):
        settings = settings_for(root, str(tmp_path / name), max_steps=4)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(settings.__dict__))
        assert train.main([str(path)]) == 0
        losses.append(
            [s.loss for s in read_metrics_file(Path(settings.output_dir) / run_layout.METRICS_FILE)]
        )
    assert len(losses[0]) == 4 and losses[0] == losses[1]
    other = replace(settings_for(root, str(tmp_path / "other"), max_steps=4), seed=4)
    train.train(other)
    assert [s.loss for s in read_metrics_file(Path(other.output_dir) / run_layout.METRICS_FILE)] != losses[0]
    assert os.environ.get("WORLD_SIZE") is None  # trained at world size 1, outside torchrun


def test_chat_and_text_rows_are_masked_as_their_type_trains(root, tmp_path):
    conversation = [
        {"role": "user", "content": "Uppercase: a b c d"},
        {"role": "assistant", "content": "A B C D"},
        {"role": "user", "content": "Uppercase: e f g h"},
        {"role": "assistant", "content": "E F G H"},
    ]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"conversation": conversation}) + "\n")
    (tmp_path / "text.jsonl").write_text(json.dumps({"body": "hello world"}) + "\n")

    chat = settings_for(
        root, str(tmp_path / "chat"), dataset_type="chat", column_map={"messages": "conversation"}
    )
    trainer = train.build_trainer(replace(chat, data_files=[str(tmp_path / "chat.jsonl")]))
    row, tokenizer = trainer.train_dataset[0], trainer.processing_class
    # The tiny Qwen3 template has no {% generation %} markers and TRL cannot patch it: the last turn is trained.
    assert trainer.completion_only_loss and not trainer.args.assistant_only_loss
    trained = tokenizer.decode([t for t in row["labels"] if t != -100])
    assert trained.endswith("E F G H<|im_end|>\n") and "A B C D" not in trained
    assert "A B C D" in tokenizer.decode(row["input_ids"])  # the earlier turn is context

    text = settings_for(root, str(tmp_path / "text"), dataset_type="text", column_map={"text": "body"})
    trainer = train.build_trainer(replace(text, data_files=[str(tmp_path / "text.jsonl")]))
    row = trainer.train_dataset[0]
    assert row["labels"] == row["input_ids"]  # text trains every token
    assert tokenizer.decode(row["labels"]) == "hello world<|im_end|>"


def test_a_template_with_generation_markers_trains_every_assistant_turn():
    class Tokenizer:
        chat_template = (
            "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
        )

    assert chat_loss_mode(Tokenizer()) == ASSISTANT_TURNS


def test_missing_columns_are_named_with_the_fix(root, tmp_path):
    bad = settings_for(root, str(tmp_path / "bad"), column_map={"input": "question"})
    with pytest.raises(ValueError, match="no column question.*set data_column_map"):
        load_rows(bad, has_chat_template=True)


def test_torchrun_trains_data_parallel_at_its_world_size(root, tmp_path):
    """Under torchrun (2 CPU processes, gloo) the trainer takes its world size from torchrun's environment: 32 rows
    at 4 per process make 4 steps an epoch (8 at world size 1); rank 0 alone writes the outputs."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    data = tmp_path / "rows.parquet"
    pq.write_table(pq.read_table(root / "data" / "train.parquet").slice(0, 32), data)
    settings = settings_for(root, str(tmp_path / "ddp"), data_files=[str(data)], max_steps=None, epochs=1)
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings.__dict__))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "kfp_finetune.components._shared.transformers.train", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = Path(settings.output_dir)
    assert face.read_resolved_config(run)["world_size"] == 2
    assert [s.step for s in read_metrics_file(run / run_layout.METRICS_FILE)] == [1, 2, 3, 4]
    assert (
        face.last_adapter_state(run) is not None and (run / run_layout.MERGED_DIR / "config.json").is_file()
    )


def test_tokens_per_second_counts_the_trained_tokens_not_the_masked_prompt(root):
    """A micro-batch's trained tokens are its label positions in the loss: the instruct rows' prompts (masked, as
    torchtune's train_on_input false) are not counted, as torchtune does not count them."""
    trainer = train.build_trainer(settings_for(root, "count"))
    batch = next(iter(trainer.get_train_dataloader()))
    in_loss = int((batch["labels"] != train.IGNORED_LABEL).sum())
    assert 0 < in_loss < int(batch["attention_mask"].sum()), "the prompts are masked out of the loss"
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets before its steps
    trainer.training_step(trainer.model, batch)
    assert trainer.trained_tokens.count == in_loss


def _train_process(settings: SftSettings, folder: Path):
    import subprocess
    import sys
    from dataclasses import asdict

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sft_settings.json"
    path.write_text(json.dumps(asdict(settings)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", train.__name__, str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_run_stopped_by_sigterm_saves_a_checkpoint_and_its_restart_resumes_where_it_stopped(root, tmp_path):
    """SIGTERM (a preempted pod) in the run's second epoch: the run saves a checkpoint, stops and exits 143; the
    same command again resumes from it and trains to the end with the uninterrupted run's losses, each step logged
    once (the rows grouped by length, as on CPU, in the same order in the restarted process: epoch_seeded)."""
    import signal

    import pyarrow.parquet as pq

    steps = 30
    data = tmp_path / "rows.parquet"  # 48 rows at batch 4: 12 steps an epoch
    pq.write_table(pq.read_table(root / "data" / "train.parquet").slice(0, 48), data)
    straight = settings_for(
        root, "straight", data_files=[str(data)], max_steps=steps, checkpoint_every_steps=4,
        checkpoint_every_minutes=0,
    )  # fmt: skip
    done = _train_process(straight, root / "straight")
    assert done.wait(timeout=600) == 0, done.stdout.read()[-3000:]
    expected = [
        round(s.loss, 4) for s in read_metrics_file(Path(straight.output_dir) / run_layout.METRICS_FILE)
    ]

    stopped = replace(straight, output_dir=str(root / "stopped"))
    metrics = Path(stopped.output_dir) / run_layout.METRICS_FILE
    first = _train_process(stopped, root / "stopped")
    for line in first.stdout:  # synchronised on the run's own output: step 15 logged, then the signal
        if line.startswith("Step 15 |"):
            first.send_signal(signal.SIGTERM)
            break
    rest = first.stdout.read()
    assert first.wait(timeout=600) == OWN_POD_STOPPING, rest[-3000:]
    (saved,) = list((Path(stopped.output_dir) / "trainer").glob("checkpoint-*"))
    at = int(saved.name.rpartition("-")[2])
    assert 15 <= at < 24 and "stopped (the pod is stopping)" in rest  # in the second epoch, not at its start
    assert not (Path(stopped.output_dir) / run_layout.MERGED_DIR).exists(), "no output from a stopped run"

    again = _train_process(stopped, root / "stopped")
    output = again.stdout.read()
    assert again.wait(timeout=600) == 0, output[-3000:]
    assert f"saved checkpoint-{at}: training resumes from it" in output
    logged = read_metrics_file(metrics)
    assert [s.step for s in logged] == list(range(1, steps + 1))
    assert [round(s.loss, 4) for s in logged] == expected
    assert read_resume_points(metrics) == [at] and f"Resumed after step {at} (from checkpoint-{at})" in output
    assert not (Path(stopped.output_dir) / "trainer").exists(), "checkpoints removed once the run is complete"
    assert face.last_adapter_state(Path(stopped.output_dir)) is not None


def test_the_pods_stop_request_saves_and_stops_the_run_but_not_at_its_last_step(tmp_path, monkeypatch):
    """The preStop hook's request (stop_request.py) saves a checkpoint and stops, as SIGTERM does; at the last step
    the run finishes and writes its outputs instead: the Trainer would resume that checkpoint into one step more."""
    import tempfile

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import DefaultFlowCallback

    from kfp_finetune.components._shared import stop_request

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this container's temp folder
    callback = train.checkpoint_callback(every_minutes=0)
    # With checkpoint_every_steps the Trainer saves by steps, and its own flow asks for a checkpoint at the end.
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), save_strategy="steps", save_steps=10, report_to=[]
    )

    def at(step: int) -> TrainerControl:
        control, state = TrainerControl(), TrainerState(global_step=step, max_steps=3, save_steps=10)
        for flow in (DefaultFlowCallback(), callback):  # in the Trainer's order: its defaults first
            flow.on_step_end(args, state, control)
        return control

    assert not at(1).should_save
    stop_request.request()
    assert (at(2).should_save, at(2).should_training_stop) == (True, True)
    assert (at(3).should_save, at(3).should_training_stop) == (False, True)  # the end, as planned


def test_a_stopped_process_records_its_stop_before_the_last_barrier(root, tmp_path, monkeypatch):
    """The stop's record (stop_exit.record_stop) is on disk when the process enters the barrier after its checkpoint:
    past it another node's pod may exit with the rendezvous store, and this node's agent, failing at once, ends this
    process before it could say how it stopped (CI: the pod exited 1, which the runtimes' FailJob rule took for a
    crash)."""
    import tempfile

    from accelerate import Accelerator

    from kfp_finetune.components._shared import stop_request
    from kfp_finetune.components._shared.stop_exit import recorded_stop_codes

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this container's temp folder
    hold = stop_request.TrainingProcess.hold

    def hold_then_asked(process):  # the preStop hook's request comes as training begins
        hold(process)
        stop_request.request()

    recorded_at_barriers = []
    barrier = Accelerator.wait_for_everyone

    def spied_barrier(accelerator):
        recorded_at_barriers.append(recorded_stop_codes(since=0))
        barrier(accelerator)

    monkeypatch.setattr(stop_request.TrainingProcess, "hold", hold_then_asked)
    monkeypatch.setattr(Accelerator, "wait_for_everyone", spied_barrier)
    summary = train.train(settings_for(root, "stopped-at-once", max_steps=3))
    assert summary["interrupted"] and summary["global_step"] == 1
    assert recorded_at_barriers[-1] == [OWN_POD_STOPPING]


@pytest.mark.parametrize(
    ("global_step", "marker"),
    [(4, "Resumed after step 4 (from checkpoint-4)"), (0, "Resumed after step 0 (no complete checkpoint")],
)
def test_a_restart_says_in_the_metrics_file_where_training_continues(tmp_path, global_step, marker):
    """An earlier start logged steps 1-6: the restart keeps the steps up to its checkpoint's and says where it
    continues (0: no checkpoint, started over), the line the step's `resumes` metric and report read."""
    from transformers import TrainerState

    from kfp_finetune.components._shared.metrics_file import collect_steps

    path = tmp_path / "metrics.txt"
    path.write_text("".join(f"Step {n} | loss:{3 - n / 10}\n" for n in range(1, 7)))
    state = TrainerState(global_step=global_step)
    train.metrics_callback(path, train.TrainedTokens()).on_train_begin(None, state, None)

    lines = path.read_text().splitlines()
    assert lines[-1].startswith(marker) and read_resume_points(path) == [global_step]
    assert [s.step for s in collect_steps(lines)] == list(range(1, global_step + 1))


def test_a_first_start_writes_no_resume_line(tmp_path):
    from transformers import TrainerState

    path = tmp_path / "metrics.txt"
    train.metrics_callback(path, train.TrainedTokens()).on_train_begin(None, TrainerState(), None)
    assert path.read_text() == "" and read_resume_points(path) == []


@pytest.mark.parametrize(("rows", "cap", "epochs", "trained"), [(12, 100, 2, 6), (32, 2, 2, 4)])
def test_max_steps_per_epoch_caps_each_epoch_as_torchtune_does(root, tmp_path, rows, cap, epochs, trained):
    """torchtune's tune_max_steps_per_epoch: min(cap, the data's steps per epoch) x epochs optimizer steps. 12 rows
    at batch 4 are 3 steps an epoch: a cap of 100 trains 2 epochs of them, not 100 x 2 steps over repeated data
    (HF's max_steps); 32 rows under a cap of 2 train 2 steps in each of 2 epochs. The schedule is planned over
    those steps: the resolved config's max_steps."""
    import pyarrow.parquet as pq

    data = tmp_path / "rows.parquet"
    pq.write_table(pq.read_table(root / "data" / "train.parquet").slice(0, rows), data)
    settings = settings_for(root, str(tmp_path / "run"), data_files=[str(data)], max_steps=None,
                            max_steps_per_epoch=cap, epochs=epochs)  # fmt: skip
    summary = train.train(settings)
    assert summary["global_step"] == trained
    resolved = face.read_resolved_config(Path(settings.output_dir))
    assert resolved["sft_config"]["max_steps"] == trained


@pytest.mark.filterwarnings(
    "ignore:Unsupported layer type"
)  # PEFT's word for a 3D-parameter target: expected
def test_a_lora_run_says_which_expert_weights_it_leaves_to_the_base(root):
    """all-linear reaches no 3D expert weight of Qwen3-MoE: the run names them and the setting that trains them;
    naming them in target_parameters, or a full fine-tune, leaves nothing to say."""
    lora = settings_for(root, "reach")
    note = train.experts_note(lora, train.build_trainer(lora).model)
    assert "(mlp.experts.down_proj, mlp.experts.gate_up_proj)" in note and "tune_method=full" in note
    targeted = replace(lora, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    assert train.experts_note(targeted, train.build_trainer(targeted).model) is None
    full = replace(lora, method="full")
    assert train.experts_note(full, train.build_trainer(full).model) is None


def test_packs_too_few_for_a_run_that_learns_are_unpacked_and_a_packing_the_user_set_is_kept(root, log_lines):
    """Packing chosen where the run trains (auto: on a GPU with flash attention) puts many rows in one sample, so a
    run the row count planned at 40 optimizer steps would train a handful: the rows are unpacked again (one per
    sample), the choice and its reason recorded. Packing the user set is kept, with a warning."""
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    settings = settings_for(root, "packed", max_steps=None, epochs=1, max_seq_len=256)
    tokenizer = AutoTokenizer.from_pretrained(settings.model_dir)
    sft, lora, rows = train.formatted_rows(settings, tokenizer)
    sft.packing = True  # as fast.py chooses it on a GPU with flash attention (here TRL packs under SDPA)
    packed = SFTTrainer(
        settings.model_dir, args=sft, train_dataset=rows, processing_class=tokenizer, peft_config=lora
    )
    steps = run_length.trained_steps(packed, settings)
    assert steps < 20 and len(packed.train_dataset) < len(rows) == 160

    unpacked = run_length.unpacked_for_floor(settings, packed)
    assert unpacked.packing is False and unpacked.planned[-1]["setting"] == "packing"
    assert unpacked.planned[-1]["reason"] == (
        f"packed, the rows make {len(packed.train_dataset)} sample(s): {steps} optimizer step(s), fewer than the 20 a "
        "run needs (MIN_OPTIMIZER_STEPS): rows unpacked, one per sample"
    )
    assert run_length.trained_steps(train.build_trainer(unpacked), unpacked) == 40  # 160 rows, batch 4
    assert run_length.unpacked_for_floor(replace(settings, packing=True), packed) is None
    assert any("fewer than the 20 a run needs (MIN_OPTIMIZER_STEPS); kept as set (tune_packed)" in line
               for line in log_lines)  # fmt: skip
