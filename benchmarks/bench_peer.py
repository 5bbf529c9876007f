"""7. Peer baseline: Hugging Face TRL `SFTTrainer` + PEFT LoRA vs torchtune LoRA (our engine), same everything.

torchtune side: a YAML resolved by the component's engine (LoRA on the small model, unpacked, fixed batch size,
max_seq_len, steps, seed, AdamW, schedule), run with plain `tune run`. TRL side, in a fresh process: the model
loaded from the same HF folder with `AutoModelForCausalLM` (fp32), PEFT LoRA with the same rank, alpha, dropout and
target projections (q/k/v/o + MLP), `SFTConfig` with the same batch size, steps, lr, weight decay, warm-up,
schedule, gradient clipping, seed, no packing, no gradient checkpointing, and the *same token sequences*: the
torchtune dataset node is instantiated and its `tokens`/`labels` become TRL's pre-tokenized `input_ids`/`labels`.
Both collate by padding to the batch's longest row.

tokens/s on both sides = unmasked label tokens of a step ÷ that step's wall time (torchtune: its
`tokens_per_second_per_gpu`; TRL: labels != -100 counted in `training_step`, time between `on_step_end` calls),
first step skipped, median. Sides alternate per repeat.
"""

from __future__ import annotations

import json
import subprocess

from benchmarks.common import (
    PY,
    ROOT,
    Settings,
    bench_env,
    fresh_dir,
    long_tailed_data,
    median,
    spread,
    steady,
    tiny_model,
    torchtune_run,
    versions,
)
from benchmarks.drivers import parse_result

NAME = "peer"
TITLE = "7. Peer baseline (TRL SFTTrainer + PEFT LoRA vs torchtune LoRA)"


def run(s: Settings, echo=print) -> dict:
    model_dir = tiny_model(s.workdir, s.big_dim, s.big_layers, s.big_heads, s.big_kv_heads)
    data = long_tailed_data(s.workdir, rows=int(s.extra.get("peer_rows", 2000)))
    base = fresh_dir(s.workdir / NAME)
    settings = {
        "method": "lora", "batch_size": s.batch_size, "gradient_accumulation_steps": 1, "max_seq_len": s.seq_len, "max_steps_per_epoch": s.train_steps,
        "learning_rate": 3e-4, "num_warmup_steps": 0, "enable_activation_checkpointing": False, "packed": False,
        "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.0, "apply_lora_to_mlp": True,
        "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
    }  # fmt: skip
    ours, peer = [], []
    yaml_path, trl_result = None, {}
    for repeat in range(s.repeats):
        for side in ("torchtune", "trl") if repeat % 2 == 0 else ("trl", "torchtune"):
            if side == "torchtune" or yaml_path is None:
                result = torchtune_run(model_dir, data, base / "torchtune", **settings)
                yaml_path = base / "resolved.yaml"
                yaml_path.write_text(result["yaml_path"].read_text())
                if side == "torchtune":
                    ours.append(result["tokens_per_second"])
                    echo(
                        f"  torchtune: {result['tokens_per_second']:.0f} tok/s, wall {result['wall_seconds']:.1f}s"
                    )
            if side == "trl":
                args_file = base / "trl-args.json"
                args_file.write_text(
                    json.dumps(
                        {
                            "yaml_path": str(yaml_path),
                            "model_dir": str(model_dir),
                            "output_dir": str(fresh_dir(base / "trl-out")),
                        }
                    )  # fmt: skip
                )
                proc = subprocess.run(
                    [PY, "-m", "benchmarks.drivers", "trl", str(args_file)],
                    cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                )  # fmt: skip
                (base / "trl.log").write_text(proc.stdout)
                if proc.returncode:
                    raise RuntimeError(f"TRL run failed:\n{proc.stdout[-4000:]}")
                trl_result = parse_result(proc.stdout)
                tps = median(steady(trl_result["step_tokens_per_second"]))
                peer.append(tps)
                echo(f"  TRL: {tps:.0f} tok/s, train {trl_result['train_seconds']:.1f}s")
    ratio = median(ours) / median(peer)
    v = versions()
    return {
        "name": NAME,
        "title": TITLE,
        "target": "tokens/s ratio (torchtune / TRL) >= 1.0",
        "met": ratio >= 1.0,
        "headline": f"torchtune {median(ours):.0f} vs TRL {median(peer):.0f} trained tokens/s: ratio {ratio:.3f}",
        "results": {
            "tokens_per_second_ratio": round(ratio, 4),
            "torchtune_tokens_per_second": spread(ours),
            "trl_tokens_per_second": spread(peer),
            "trl_trainable_parameters": trl_result.get("trainable_parameters"),
            "trl_gradient_checkpointing": trl_result.get("gradient_checkpointing"),
        },
        "settings": {
            "model": f"tiny llama3_2 dim {s.big_dim}, {s.big_layers} layers (same HF folder both sides)",
            "data": f"{data.name}, tokenized once by torchtune, same ids both sides",
            "steps": s.train_steps,
            "repeats": s.repeats,
            "trl": v["trl"],
            "transformers": v["transformers"],
            "peft": v["peft"],
            **settings,
        },  # fmt: skip
    }
