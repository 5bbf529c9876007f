"""Child-process entry points, so a measured side pays its own interpreter start and imports like the real thing.

    python -m benchmarks.drivers component ARGS.json   # run_finetune (the component's implementation), local backend
    python -m benchmarks.drivers pipeline ARGS.json    # finetune_pipeline under kfp.local
    python -m benchmarks.drivers imports MODULE...     # import a component body's modules; report time and torch
    python -m benchmarks.drivers trl ARGS.json         # the peer baseline: TRL SFTTrainer + PEFT LoRA

Each prints one line `BENCH-RESULT <json>` at the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

_START = time.perf_counter()


def _emit(data: dict) -> None:
    print("BENCH-RESULT " + json.dumps(data, default=str), flush=True)


def component(args: dict) -> None:
    from kfp_finetune.components.torchtune_finetune.backends import backend_for
    from kfp_finetune.components.torchtune_finetune.finetune import ArtifactInput, run_finetune

    result = run_finetune(
        workspace=args["workspace"],
        train_data=ArtifactInput(args["train_metadata"]),
        base_model=ArtifactInput(args["model_metadata"]),
        settings=args["settings"],
        run_id=args["run_id"],
        task_name="torchtune-finetune",
        backend=backend_for("local"),
        engine=args.get("engine", "auto"),
    )
    _emit(
        {
            "training_wall_seconds": result.wall_seconds,
            # torchtune's resolved YAML; another engine's resolved settings
            "yaml_path": str(getattr(result.run, "yaml_path", None) or result.run.resolved_path),
            "run_dir": str(result.run.run_dir),
            "recipe": result.run.recipe,
            "metrics_path": str(result.run.metrics_path),
        }
    )


def pipeline(args: dict) -> None:
    from kfp_finetune.commands.run_local import run_pipeline_locally
    from kfp_finetune.pipelines import finetune_pipeline

    task = run_pipeline_locally(finetune_pipeline, args["arguments"], args["output_dir"])
    _emit({"train_metrics": dict(task.outputs["train_metrics"].metadata)})


def imports(modules: list[str]) -> None:
    import importlib

    # What every KFP step imports before it calls the function (kfp's executor).
    importlib.import_module("kfp.dsl.executor_main")
    for name in modules:
        importlib.import_module(name)
    _emit(
        {
            "import_seconds": time.perf_counter() - _START,
            "torch_imported": "torch" in sys.modules,
            "transformers_imported": "transformers" in sys.modules,
            "datasets_imported": "datasets" in sys.modules,
        }
    )


def torchtune_samples(config: dict) -> tuple[list[list[int]], list[list[int]]]:
    """The exact token ids and labels torchtune trains on for a resolved config (its tokenizer + dataset nodes)."""
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    cfg = OmegaConf.create(config)
    tokenizer = tt_config.instantiate(cfg.tokenizer)
    dataset = tt_config.instantiate(cfg.dataset, tokenizer)
    input_ids, labels = [], []
    for index in range(len(dataset)):
        sample = dataset[index]
        input_ids.append(list(sample["tokens"]))
        labels.append([int(x) for x in sample["labels"]])
    return input_ids, labels


def trl(args: dict) -> None:
    """TRL SFTTrainer + PEFT LoRA with the torchtune run's settings, on the same tokens; per-step timing."""
    import datasets
    import torch
    import yaml
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    config = yaml.safe_load(Path(args["yaml_path"]).read_text())
    model_cfg = config["model"]
    input_ids, labels = torchtune_samples(config)
    train = datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels})

    modules = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
    targets = [modules[m] for m in model_cfg["lora_attn_modules"]]
    if model_cfg.get("apply_lora_to_mlp"):
        targets += ["gate_proj", "up_proj", "down_proj"]
    peft_config = LoraConfig(
        r=model_cfg["lora_rank"], lora_alpha=model_cfg["lora_alpha"], lora_dropout=model_cfg.get("lora_dropout", 0.0),
        target_modules=targets, bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=f"{args['model_dir']}/tokenizer.json")
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    tokenizer.pad_token = (
        "<|finetune_right_pad_id|>" if "<|finetune_right_pad_id|>" in added else tokenizer.eos_token
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = sorted(added)[0]
    model = AutoModelForCausalLM.from_pretrained(args["model_dir"], dtype=torch.float32)
    optimizer = config["optimizer"]
    scheduler = config.get("lr_scheduler") or {}
    sft_args = SFTConfig(
        output_dir=args["output_dir"],
        per_device_train_batch_size=config["batch_size"],
        gradient_accumulation_steps=config.get("gradient_accumulation_steps", 1),
        max_steps=config["max_steps_per_epoch"],
        learning_rate=float(optimizer["lr"]),
        weight_decay=float(optimizer.get("weight_decay", 0.0)),
        optim="adamw_torch",
        lr_scheduler_type="cosine" if "cosine" in scheduler.get("_component_", "") else "constant",
        warmup_steps=int(scheduler.get("num_warmup_steps", 0)),
        max_grad_norm=float(config.get("clip_grad_norm") or 0.0),
        max_length=config["tokenizer"].get("max_seq_len"),
        packing=False,
        gradient_checkpointing=bool(config.get("enable_activation_checkpointing")),
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=int(config.get("seed") or 0),
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    timeline: list[tuple[float, int]] = []
    counted = [0]

    class Counting(SFTTrainer):
        def training_step(self, model, inputs, *rest, **kwargs):
            counted[0] += int((inputs["labels"] != -100).sum())
            return super().training_step(model, inputs, *rest, **kwargs)

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            timeline.append((time.perf_counter(), 0))

        def on_step_end(self, *a, **k):
            timeline.append((time.perf_counter(), counted[0]))

    trainer = Counting(
        model=model, args=sft_args, train_dataset=train, processing_class=tokenizer, peft_config=peft_config,
        callbacks=[Clock()],
    )  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    per_step = [
        (tokens - prev_tokens) / (when - prev_when)
        for (prev_when, prev_tokens), (when, tokens) in zip(timeline, timeline[1:], strict=False)
    ]
    _emit(
        {
            "step_tokens_per_second": per_step,
            "train_seconds": train_seconds,
            "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "samples": len(input_ids),
            "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        }
    )


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    if command == "imports":
        imports(rest)
    else:
        with open(rest[0]) as f:
            args = json.load(f)
        {"component": component, "pipeline": pipeline, "trl": trl}[command](args)
    return 0


def parse_result(output: str) -> dict:
    """The `BENCH-RESULT` payload of a driver's output."""
    for line in reversed(output.splitlines()):
        if line.startswith("BENCH-RESULT "):
            return json.loads(line[len("BENCH-RESULT ") :])
    raise RuntimeError("driver printed no BENCH-RESULT line; its output ends:\n" + output[-3000:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
