"""Tiny offline model kit and synthetic dataset for tests and the demo.

- `kfp_finetune.tiny.model.build_tiny_model(out_dir, family, dim, seed, ...)`: an HF-layout Llama-3.2,
  Qwen2.5, Qwen3 or Gemma 3 style model (config.json, model.safetensors, tokenizer files) that torchtune loads like
  the real thing, built offline and byte-for-byte deterministic.
- `kfp_finetune.tiny.dataset.build_tiny_dataset(out_dir, seed, train_rows, eval_rows)`: the synthetic
  instruct task (upper-case a four-letter code) as JSON Lines and Parquet, columns `input` / `output`.
- `kfp_finetune.tiny.hf_models.build_tiny_hf_model(out_dir, kind, seed)`: a folder made by transformers' own
  classes for the transformers / TRL engine (a Qwen3-MoE causal LM, a Gemma 3 vision-language model with its
  processor, a BERT 5-star classifier), loadable with the Auto classes offline, byte-for-byte deterministic.

All three are also CLI commands: `kfp-finetune tiny-model OUT`, `kfp-finetune tiny-dataset OUT` and
`kfp-finetune tiny-hf-model OUT --kind KIND`.
This module imports neither torch nor torchtune.
"""

# Training settings measured on the default tiny models (dim 64, 2 layers, seed 0) and the default dataset
# (20 000 train rows, 100 held out) with torchtune 0.6.1 on CPU: `device: cpu`, `dtype: fp32`,
# `torch.optim.AdamW` (weight_decay 0), `optimizer_in_bwd: False`, cosine schedule with warmup,
# `CEWithChunkedOutputLoss`, `instruct_dataset` with `train_on_input: False`, one epoch of
# `max_steps_per_epoch` steps. `measured` is what the setting reached here (2 shared cores, one torch
# thread, other jobs running): mean loss of the first 5 / last 10 steps, greedy exact match on 50 held-out
# rows (the untrained base scores 0.0), wall time of `tune run` (~5 s of it is start-up).
#
# `max_seq_len: -1` is "unset" (the base config's: no limit; rows are ~20 tokens). A trap the settings avoid:
# - LoRA cannot reach exact matches on a *random* base within minutes: the tied embedding/output layer,
#   the norms and the random attention stay frozen. LoRA settings below give a clear loss drop (enough to
#   test the pipeline's mechanics and an eval-loss gate); use full fine-tuning for an exact-match gate.
RECOMMENDED_TRAINING: dict[str, dict] = {
    "full": {
        "recipe": "full_finetune_single_device",
        "lr": 3e-3,
        "batch_size": 16,
        "max_steps_per_epoch": 600,
        "num_warmup_steps": 10,
        "max_seq_len": -1,
        "measured": {
            "llama3_2": {"loss_first_5": 8.22, "loss_last_10": 0.006, "exact_match": 1.0, "wall_seconds": 38},
            "qwen2_5": {"loss_first_5": 7.86, "loss_last_10": 0.008, "exact_match": 1.0, "wall_seconds": 38},
        },
    },
    "lora": {
        "recipe": "lora_finetune_single_device",
        "lr": 3e-3,
        "batch_size": 16,
        "max_steps_per_epoch": 600,
        "num_warmup_steps": 10,
        "max_seq_len": -1,
        "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True,
        "apply_lora_to_output": False,  # impossible with tied embeddings (torchtune raises)
        "lora_rank": 32,
        "lora_alpha": 64,
        "lora_dropout": 0.0,
        "measured": {
            "llama3_2": {"loss_first_5": 8.37, "loss_last_10": 2.47, "exact_match": 0.0, "wall_seconds": 53},
            "qwen2_5": {"loss_first_5": 8.00, "loss_last_10": 2.76, "exact_match": 0.0, "wall_seconds": 43},
        },
    },
}
