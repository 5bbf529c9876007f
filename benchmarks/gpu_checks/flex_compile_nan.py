"""GPU check: packed training steps with torchtune 0.6.1's flex-attention compile setting and with ours; NaN or not.

    python -m benchmarks.gpu_checks.flex_compile_nan              # on a CUDA GPU (compute capability >= 7.5)
    python -m benchmarks.gpu_checks.flex_compile_nan --steps 60   # more steps; --dim / --layers for a larger model

Not a test: it needs a GPU, where torchtune gives packed batches a BlockMask and flex attention. Two settings, each
in its own process (torch.compile caches compiled code per function, so one process would share it):
- torchtune: the family's builder as torchtune 0.6.1 builds it: attention through `flex_attention_compiled`,
  `torch.compile(flex_attention, dynamic=False)` (torchtune/modules/attention_utils.py);
- ours: the builder a packed CUDA run's resolved YAML names (components/_shared/torchtune/flex_attention.py):
  flex attention compiled with torch.compile's defaults, as torchtune main compiles it since its PR 2765.

Each runs `--steps` optimizer steps of a model from the tiny kit at `--dim` x `--layers` in bf16, its layers
compiled as `compile: True` compiles them (torchtune.training.compile_model), on random packs cut as torchtune packs
(samples of random lengths, block-causal document mask and input_pos from torchtune's padded_collate_packed, labels
shifted over the pack as the recipes shift them, AdamW). The pack length cycles through `--seq-lens` so the compiled
flex attention meets new shapes (where the two settings differ: dynamic=False recompiles every shape, the default
compiles a dynamic kernel on the first change). It prints, per setting: the first step whose loss or gradients are
not finite (or none), the first step's loss next to the same batch's loss with the dense mask and SDPA in fp32
(how far the compiled path is from the reference), and the seconds taken. Exit code 1 when ours produced a NaN.
On a machine without such a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = ("torchtune", "ours")
IGNORE = -100
DEVICE = "cuda"


def flex_gpu() -> str:
    """Why flex attention cannot run here ("" when it can)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() < (7, 5):
        return f"{torch.cuda.get_device_name()} is older than compute capability 7.5 (no flex attention)"
    return ""


def build_model(setting: str, dim: int, layers: int, workdir: Path):
    """The tiny kit's model at these dims, with its weights, built as `setting` builds it."""
    import torch
    from omegaconf import OmegaConf
    from torchtune import config, training

    from kfp_finetune.components._shared.torchtune import builder_nodes, flex_attention
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
    from kfp_finetune.tiny.model import build_tiny_model

    model_dir = inspect_model_dir(
        build_tiny_model(workdir / "model", dim=dim, num_layers=layers, num_heads=8, num_kv_heads=2)
    )
    node = model_dir.model_node()
    arguments = {k: v for k, v in node.items() if k != "_component_"}
    with torch.device(DEVICE):
        if setting == "ours":
            model = flex_attention.flex_attention_model(builder=node["_component_"], **arguments)
        else:
            model = builder_nodes.builder(node["_component_"])(**arguments)
    checkpointer = config.instantiate(OmegaConf.create(model_dir.checkpointer_node(str(workdir / "out"))))
    model.load_state_dict(checkpointer.load_checkpoint()[training.MODEL_KEY])
    return model


def packs(step: int, batch_size: int, seq_len: int, vocab: int) -> list[dict]:
    """Random packs of `seq_len` tokens: samples of 16..seq_len/4 tokens, the rest padding, as PackedDataset makes."""
    import torch

    from kfp_finetune.components._shared.torchtune.sample_packing import ignore_sample_starts

    generator = torch.Generator().manual_seed(step)
    made = []
    for _ in range(batch_size):
        lengths, filled = [], 0
        while True:
            n = int(torch.randint(16, max(17, seq_len // 4), (1,), generator=generator))
            if filled + n > seq_len:
                break
            lengths.append(n)
            filled += n
        pad = seq_len - filled
        tokens = torch.randint(1, vocab, (seq_len,), generator=generator)
        tokens[filled:] = 0
        labels = tokens.clone()
        labels[filled:] = IGNORE
        seq_lens = torch.tensor(lengths + ([pad] if pad else []))
        ignore_sample_starts(labels, seq_lens)
        input_pos = torch.cat([torch.arange(int(n)) for n in seq_lens])
        made.append({"tokens": tokens, "labels": labels, "input_pos": input_pos, "seq_lens": seq_lens})
    return made


def loss_of(model, batch: dict):
    import torch
    import torch.nn.functional as F

    labels = batch["labels"]
    logits = model(batch["tokens"], mask=batch["mask"], input_pos=batch["input_pos"])
    targets = torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], IGNORE)))
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE
    )


def reference_loss(model, batch_packs: list[dict]) -> float:
    """The batch's loss in fp32 with torchtune's dense block-causal mask (SDPA: no flex attention)."""
    import copy

    import torch
    from torchtune.modules.attention_utils import create_block_causal_mask

    reference = copy.deepcopy(model).float()
    batch = {
        key: torch.stack([p[key] for p in batch_packs]).to(DEVICE)
        for key in ("tokens", "labels", "input_pos")
    }
    batch["mask"] = create_block_causal_mask([p["seq_lens"].to(DEVICE) for p in batch_packs])
    with torch.no_grad():
        return float(loss_of(reference, batch))


def run_setting(setting: str, args) -> dict:
    """One setting's steps, in this process."""
    import torch
    from torchtune import training
    from torchtune.data import padded_collate_packed

    with tempfile.TemporaryDirectory(prefix="flex-nan-") as workdir:
        model = build_model(setting, args.dim, args.layers, Path(workdir))
    vocab = model.tok_embeddings.num_embeddings
    first = packs(0, args.batch_size, args.seq_lens[0], vocab)
    reference = reference_loss(model, first)
    model = model.to(torch.bfloat16)
    training.compile_model(model, verbose=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    first_nan, losses, started = None, [], time.monotonic()
    for step in range(args.steps):
        seq_len = args.seq_lens[step % len(args.seq_lens)]
        batch_packs = first if step == 0 else packs(step, args.batch_size, seq_len, vocab)
        batch = padded_collate_packed(batch_packs)  # the BlockMask: torchtune's, on CUDA
        batch = {key: value.to(DEVICE) if torch.is_tensor(value) else value for key, value in batch.items()}
        loss = loss_of(model, batch)
        loss.backward()
        grads_finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        losses.append(float(loss.detach()))
        if first_nan is None and not (math.isfinite(losses[-1]) and grads_finite):
            first_nan = step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "setting": setting,
        "first_non_finite_step": first_nan,
        "first_loss": losses[0],
        "first_loss_reference_fp32": reference,
        "last_loss": losses[-1],
        "steps": args.steps,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 1024, 1536])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--setting", choices=SETTINGS, help="run one setting in this process (the children)")
    args = parser.parse_args(argv)
    why = flex_gpu()
    if why:
        print(
            f"flex_compile_nan: {why}: nothing to check here; run it on a CUDA GPU (compute capability >= 7.5)"
        )
        return 0
    if args.setting:
        print(json.dumps(run_setting(args.setting, args)))
        return 0
    results = {}
    for setting in SETTINGS:
        child = [sys.executable, "-m", "benchmarks.gpu_checks.flex_compile_nan", *(argv or sys.argv[1:])]
        done = subprocess.run([*child, "--setting", setting], capture_output=True, text=True)
        if done.returncode:
            print(f"{setting}: failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
            results[setting] = {"setting": setting, "error": done.stderr[-400:]}
            continue
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        r = results[setting]
        nan = (
            "no NaN" if r["first_non_finite_step"] is None else f"NaN from step {r['first_non_finite_step']}"
        )
        print(
            f"{setting:>9}: {nan} in {r['steps']} steps; first loss {r['first_loss']:.4f} (fp32 SDPA reference "
            f"{r['first_loss_reference_fp32']:.4f}), last {r['last_loss']:.4f}; {r['seconds']} s"
        )
    print(json.dumps(results))
    ours = results["ours"]
    return 1 if "error" in ours or ours["first_non_finite_step"] is not None else 0


if __name__ == "__main__":
    sys.exit(main())
