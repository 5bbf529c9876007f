"""Throughput defaults chosen from the data, the model and the hardware (DESIGN.md §7), each with its reason.

`choose_defaults` runs on the assembled config after the user's typed settings and `overrides`: a setting the user
gave (typed or as an override key) is never touched. On CUDA it decides packing + a data-derived `max_seq_len`,
`compile`, activation checkpointing / offloading from a memory model (memory_model.py), the micro-batch (~8-16k
tokens, down to 4k where that spares activation checkpointing; on several nodes ~32k where that fits without
checkpointing; never more than the GPUs' share of the base config's tokens per optimizer step, down to 8k) and gradient accumulation (the base config's tokens per optimizer
step, over all devices). On every device the run names, run_length.py then keeps the run at least
MIN_OPTIMIZER_STEPS long where the data allows (refusing data too small for that), scales the learning rate where
the global batch grew, and fits the LR schedule to the planned steps (no step at lr 0). On every device it keeps
`lora_alpha` at the base config's alpha/rank ratio. On CPU the throughput settings stay as they are (the tiny kit
runs fast as it is).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.micro_batch_rule import MICRO_BATCH_TOKENS, busy_floor, busy_sequences
from kfp_finetune.components._shared.seq_len_rule import (
    SAMPLE_ROWS,
    SAMPLE_SEED,
    choose_max_seq_len,
    sample_indices,
)
from kfp_finetune.components._shared.torchtune.choices import Choice, user_set
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.memory_model import (
    DEFAULT_GPU_MEMORY_GIB,
    MemoryEstimate,
    estimate_memory,
)
from kfp_finetune.components._shared.torchtune.model_inspection import Family, ModelDir
from kfp_finetune.components._shared.torchtune.prompt_fit import (
    candidate_rows,
    prompt_tokens,
    rows_as_trained,
    uncut_tokenizer,
)
from kfp_finetune.components._shared.torchtune.run_length import (
    GLOBAL_GROWTH_ACCEPTED,
    base_tokens_per_step,
    fit_run_length,
    fit_schedule,
    scale_learning_rate,
)
from kfp_finetune.components._shared.torchtune.seq_len import cut_length, fits

log = get_logger(__name__)

#: Fraction of the GPU the estimate may fill: the rest is the CUDA context, allocator fragmentation, NCCL buffers.
MEMORY_MARGIN = 0.85
#: Tried first on several nodes, only where it fits without activation checkpointing: every micro-batch's gradient
#: reduce-scatter crosses the nodes, so fewer, larger micro-batches (fewer accumulation steps) cut that traffic.
MULTI_NODE_MICRO_BATCH_TOKENS = 32768
#: Characters per token assumed when the tokenizer cannot be loaded (a preview with placeholder files):
#: low, so lengths are over- rather than under-estimated.
CHARS_PER_TOKEN = 3.0


# --- token lengths ------------------------------------------------------------------------------------------------


@dataclass
class TokenLengths:
    lengths: list[int]
    num_rows: int
    how: str  # where the lengths come from, for the reasons
    longest_prompt: int = 0  # tokens before a row's first trained one, the longest; 0: unknown


def sample_token_lengths(
    config: dict, rows: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED, *, tokenize: bool = True
) -> TokenLengths | None:
    """Token lengths (prompt + response, template included) of a seeded random sample of the training rows,
    tokenized exactly as training does (the resolved tokenizer and dataset nodes, through torchtune). None when
    the data are not local files (an HF dataset source is loaded by training itself). `tokenize=False` (the
    TrainJob launcher, which imports no torch) estimates them from characters instead (no prompt lengths then).

    Tokenized, `longest_prompt` is the longest masked prompt over the sample and over prompt_fit's candidate rows
    (the longest by characters), so the max_seq_len default never leaves a long prompt without a trained token."""
    dataset_node = config.get("dataset")
    if not isinstance(dataset_node, dict) or not dataset_node.get("data_files"):
        return None
    tokenizer, why = None, "the launcher imports no torch; dataset-initialize records exact lengths"
    if tokenize:
        try:
            tokenizer = uncut_tokenizer(config)
        except Exception as err:  # noqa: BLE001 - a preview with placeholder tokenizer files: estimate instead
            why = f"tokenizer not loadable: {type(err).__name__}: {str(err)[:80]}"
    if tokenizer is None:
        from datasets import load_dataset

        data = load_dataset(
            dataset_node["source"],
            data_files=dataset_node["data_files"],
            split=dataset_node.get("split", "train"),
        )
        picked = sample_indices(len(data), rows, seed)
        lengths = [
            max(1, math.ceil(sum(len(str(v)) for v in data[i].values() if v is not None) / CHARS_PER_TOKEN))
            for i in picked
        ]
        how = f"estimated from characters ÷ {CHARS_PER_TOKEN:g} ({why}) of {len(picked)} rows"
        return TokenLengths(lengths, len(data), how)
    dataset = rows_as_trained(config, tokenizer)
    picked = sample_indices(len(dataset), rows, seed)
    lengths, prompts = [], [0]
    for i in picked:
        row = dataset[i]
        lengths.append(len(row["tokens"]))
        prompts.append(prompt_tokens(row["labels"]))
    seen = set(picked)
    prompts += [prompt_tokens(dataset[i]["labels"]) for i in candidate_rows(dataset) if i not in seen]
    how = (
        f"a random sample of {len(picked)} of {len(dataset)} rows (seed {seed})"
        if len(picked) < len(dataset)
        else f"all {len(dataset)} rows"
    )
    return TokenLengths(lengths, len(dataset), how, longest_prompt=max(prompts))


# --- the choices -------------------------------------------------------------------------------------------------


def choose_defaults(
    config: dict,
    base: dict,
    cfg: TorchtuneConfig,
    model: ModelDir,
    devices: int,
    nodes: int,
    gpu_memory_gib: float | None = None,
    lengths: TokenLengths | None = None,
    tokenize_sample: bool = True,
    base_world: int = 1,
) -> tuple[list[Choice], TokenLengths | None]:
    """Apply the defaults to `config` in place; return each choice with its reason (also logged, one line each)
    and the token lengths they were chosen from (None when none were needed or known). `base_world`: the devices
    the base config was written for (its global batch is that many times its per-device one)."""
    choices: list[Choice] = []
    _lora_alpha(config, base, cfg, choices)
    world = devices * nodes
    # Only for a device the run names (the step always does; a bare resolve keeps the base config's settings).
    if config.get("device") == "cuda" and user_set(cfg, "device", "device"):
        if lengths is None:
            lengths = sample_token_lengths(config, tokenize=tokenize_sample)
        _packing(config, cfg, model, lengths, choices)
        if not user_set(cfg, "compile", "compile"):
            config["compile"] = True
            choices.append(Choice("compile", True, "CUDA: torch.compile speeds training ~1.3x (QLoRA ~3x)"))
        _memory_and_batch(
            config, base, cfg, model, world, nodes, gpu_memory_gib, lengths, choices, base_world
        )
    if not config["tokenizer"].get("max_seq_len") and not user_set(
        cfg, "max_seq_len", "tokenizer.max_seq_len"
    ):
        _cut_length(config, model, lengths, choices)
    if config.get("device") and user_set(cfg, "device", "device"):
        if lengths is None:  # on CPU: the rows the floor counts (and, packed, their lengths estimated)
            lengths = sample_token_lengths(config, tokenize=False)
        fit_run_length(config, cfg, world, lengths, choices)
        scale_learning_rate(config, base, cfg, world, lengths, choices, base_world)
    fit_schedule(config, cfg, world, lengths, choices)
    for choice in choices:
        log.log(logging.WARNING if choice.warning else logging.INFO, "%s", choice.line())
    return choices, lengths


def as_metadata(choices: list[Choice]) -> list[dict]:
    return [asdict(c) for c in choices]


def _lora_alpha(config: dict, base: dict, cfg: TorchtuneConfig, choices: list[Choice]) -> None:
    base_model, model = base.get("model") or {}, config.get("model") or {}
    base_rank, base_alpha = base_model.get("lora_rank"), base_model.get("lora_alpha")
    if not (cfg.is_peft and cfg.lora.lora_rank is not None and base_rank and base_alpha):
        return
    if user_set(cfg, "lora_alpha", "model.lora_alpha") or cfg.lora.lora_rank == base_rank:
        return
    alpha = float(base_alpha) / float(base_rank) * cfg.lora.lora_rank
    model["lora_alpha"] = alpha
    choices.append(
        Choice("lora_alpha", alpha, f"keeps the base config's alpha/rank = {base_alpha}/{base_rank} at rank "
               f"{cfg.lora.lora_rank}")
    )  # fmt: skip


def _packing(
    config: dict, cfg: TorchtuneConfig, model: ModelDir, lengths: TokenLengths | None, choices: list[Choice]
) -> None:
    tokenizer = config["tokenizer"]
    if not user_set(cfg, "max_seq_len", "tokenizer.max_seq_len"):
        if lengths is None:
            choices.append(Choice("max_seq_len", tokenizer.get("max_seq_len"),
                                  "kept: the data's token lengths are unknown (not local files)"))  # fmt: skip
        else:
            limit = model.hf_config.get("max_position_embeddings")
            tokenizer["max_seq_len"] = choose_max_seq_len(lengths.lengths, limit)
            reason = (f"99th percentile of prompt + response tokens rounded up to 256, capped at {limit} "
                      f"(longest {max(lengths.lengths)}; from {lengths.how}); longer rows are cut")  # fmt: skip
            if not fits(lengths.longest_prompt, tokenizer["max_seq_len"]):
                reason += (f", and rows whose prompt fills it (the longest: {lengths.longest_prompt} tokens) train "
                           "nothing and are counted (seq_len.py)")  # fmt: skip
            choices.append(Choice("max_seq_len", tokenizer["max_seq_len"], reason))
    if not user_set(cfg, "packed", "dataset.packed"):
        if not model.family.block_masks:
            choices.append(Choice("packed", config["dataset"].get("packed"),
                                  f"kept off: {no_packing_on_cuda(model.family)}; one row per sample"))  # fmt: skip
        elif tokenizer.get("max_seq_len"):
            config["dataset"]["packed"] = True
            choices.append(Choice("packed", True, f"rows packed into {tokenizer['max_seq_len']}-token sequences: "
                                  "no padding (torchtune: +238 % tokens/s)"))  # fmt: skip
        else:
            choices.append(
                Choice("packed", config["dataset"].get("packed"), "kept: packing needs a max_seq_len")
            )


def no_packing_on_cuda(family: Family) -> str:
    """Why a family's packed batches would fail on CUDA; "" where they would not. torchtune gives packed batches a
    BlockMask there (flex attention, compute capability 7.5 or newer), which the family's attention must take."""
    if family.block_masks:
        return ""
    return (
        f"torchtune 0.6.1's {family.name} attention takes no block masks, which packed batches get on CUDA (flex "
        "attention): it raises NotImplementedError for them"
    )


def _cut_length(config: dict, model: ModelDir, lengths: TokenLengths | None, choices: list[Choice]) -> None:
    """Every device: the tokenizer cuts rows by seq_len's rule (the packs' length), never past the model's limit."""
    limit = model.hf_config.get("max_position_embeddings")
    config["tokenizer"]["max_seq_len"] = cut_length(lengths.lengths if lengths else None, limit)
    how = f"the packs' rule, from {lengths.how}" if lengths else "the model's limit: no lengths were measured"
    choices.append(Choice("max_seq_len", config["tokenizer"]["max_seq_len"], f"rows are cut there ({how})"))


def loss_chunks(config: dict) -> int:
    """How many output chunks the config's loss computes the fp32 cross-entropy in (1: not chunked)."""
    loss = config.get("loss") or {}
    if not str(loss.get("_component_", "")).endswith("CEWithChunkedOutputLoss"):
        return 1
    return int(loss.get("num_output_chunks") or 8)  # torchtune's CEWithChunkedOutputLoss default


#: torchtune's distributed recipes read it (FSDP2's reshard_after_forward; False is ZeRO-2 / SHARD_GRAD_OP).
RESHARD_KEY = "fsdp_reshard_after_forward"


def _reshard_after_forward(
    config: dict, total: float, unsharded_rest: float, budget: float, nodes: int, choices: list[Choice]
) -> None:
    """Several nodes: keep each layer's gathered weights from its forward to its backward where the whole model
    fits unsharded beside the rest (SHARD_GRAD_OP): one all-gather of the weights per step instead of two, a third
    less FSDP traffic over the nodes' network. torchtune 0.6.1 offers no hybrid (HSDP) sharding."""
    keep = total + unsharded_rest <= budget
    config[RESHARD_KEY] = not keep
    if keep:
        why = (f"{nodes} nodes: the gathered weights stay from forward to backward ({total + unsharded_rest:.1f} GiB "
               "per GPU fits): one all-gather per step instead of two, a third less traffic between the nodes")  # fmt: skip
    else:
        why = (f"{nodes} nodes, but keeping the gathered weights would need {total + unsharded_rest:.1f} GiB per GPU: "
               "resharded after forward (two all-gathers per step)")  # fmt: skip
    choices.append(Choice(RESHARD_KEY, not keep, why))


def busy_floor_tokens(model: ModelDir) -> int:
    """The model-size floor of a micro-batch (micro_batch_rule.busy_floor)."""
    return busy_floor(int(model.hf_config["hidden_size"]))


def _memory_and_batch(
    config: dict,
    base: dict,
    cfg: TorchtuneConfig,
    model: ModelDir,
    world: int,
    nodes: int,
    gpu_memory_gib: float | None,
    lengths: TokenLengths | None,
    choices: list[Choice],
    base_world: int = 1,
) -> None:
    seq = config["tokenizer"].get("max_seq_len")
    gpu = gpu_memory_gib or DEFAULT_GPU_MEMORY_GIB
    budget = gpu * MEMORY_MARGIN
    lora = config.get("model") if cfg.is_peft else None
    optimizer = str((config.get("optimizer") or {}).get("_component_", ""))

    def estimate(tokens: int) -> MemoryEstimate:
        return estimate_memory(
            model,
            cfg.method,
            lora,
            config.get("dtype", "bf16"),
            optimizer,
            world,
            tokens,
            loss_chunks(config),
        )

    batch_set = user_set(cfg, "batch_size", "batch_size")
    accumulation_set = user_set(cfg, "gradient_accumulation_steps", "gradient_accumulation_steps")
    # The base config's tokens per optimizer step, kept over all GPUs (gradient accumulation cannot go below 1,
    # so no micro-batch larger than each GPU's share of it is taken, down to the smallest that keeps a GPU busy).
    target = (
        base_tokens_per_step(base, lengths, base_world) if seq and lengths and not accumulation_set else None
    )
    share = GLOBAL_GROWTH_ACCEPTED * target / world if target else math.inf
    capped = False  # the base config's global batch, not memory, limits the micro-batch
    floor = busy_floor_tokens(model)
    if batch_set or not seq:
        options = [int(config.get("batch_size") or 1) * int(seq or 2048)]
    else:
        # Whole sequences, rounded down: a micro-batch never grows past the busy sizes to fill a sequence.
        busy = [n * seq for n in busy_sequences(seq)]
        # Below them, the base config's share of each GPU, down to what still keeps this model's matmuls busy.
        least = min(busy[-1], max(math.ceil(floor / seq), int(share // seq), 1) * seq)
        options = [t for t in busy if t <= share] or [least]
        capped = options[0] < busy[0]
    multi_node = 0  # the larger micro-batch tried first on several nodes (never with checkpointing)
    if nodes > 1 and not batch_set and seq:
        multi_node = max(1, MULTI_NODE_MICRO_BATCH_TOKENS // seq) * seq
        multi_node = multi_node if options[0] < multi_node <= share else 0
    # Whole sequences below the smallest busy micro-batch: tried without checkpointing before any checkpointed
    # plan, down to the model's floor.
    smaller = []
    if not batch_set and seq:
        smaller = [k * seq for k in range(options[-1] // seq, 0, -1) if floor <= k * seq < options[-1]]
    ckpt_set = user_set(cfg, "enable_activation_checkpointing", "enable_activation_checkpointing")
    offload_set = user_set(cfg, "enable_activation_offloading", "enable_activation_offloading")
    # The largest micro-batch that fits without checkpointing, else with it, else offloaded.
    plans = (
        [(multi_node, False, False)] * bool(multi_node)
        + [(t, False, False) for t in options]
        + [(t, False, False) for t in smaller]
        + [(t, True, False) for t in options]
        + [(options[-1], True, True)]
    )
    if ckpt_set:
        plans = [p for p in plans if p[1] == bool(config.get("enable_activation_checkpointing"))] or plans
    if offload_set:
        plans = [p for p in plans if p[2] == bool(config.get("enable_activation_offloading"))] or plans
    tokens, ckpt, offload = next((p for p in plans if estimate(p[0]).total(p[1], p[2]) <= budget), plans[-1])
    mem = estimate(tokens)
    fits = mem.total(ckpt, offload) <= budget
    where = f"{gpu:g} GiB GPU{'' if gpu_memory_gib else ' (assumed: gpu_memory_gib unset)'}"
    estimate_text = f"{mem.summary(ckpt, offload)}, {tokens} tokens per micro-batch, on a {where}"
    if not fits:
        estimate_text += (
            f" — OVER {MEMORY_MARGIN:.0%} of it: expect out-of-memory; lower tune_max_seq_len or "
            "tune_batch_size"
        )
    if nodes > 1 and not user_set(cfg, None, RESHARD_KEY):
        _reshard_after_forward(
            config, mem.total(ckpt, offload), mem.parameters * (world - 1), budget, nodes, choices
        )
    if not ckpt_set:
        config["enable_activation_checkpointing"] = ckpt
        why = "needed" if ckpt else "not needed"
        choices.append(Choice("enable_activation_checkpointing", ckpt, f"{why}: {estimate_text}"))
    if not offload_set:
        config["enable_activation_offloading"] = offload
        choices.append(Choice("enable_activation_offloading", offload,
                              "still short with checkpointing" if offload else "not needed"))  # fmt: skip
    if not batch_set and seq:
        config["batch_size"] = max(1, tokens // seq)
        why = "8-16k keeps the GPU busy"
        if tokens in smaller and not ckpt:
            why = (
                "the largest that fits without activation checkpointing, which would cost ~30 % of each step"
            )
        if capped and tokens < MICRO_BATCH_TOKENS[-1]:
            why = (f"not 8-16k: {world} GPU(s) share the base config's ~{target:,.0f} tokens per optimizer step; "
                   f"at least {floor:,} tokens keep a {model.hf_config['hidden_size']}-wide model's matmuls busy")  # fmt: skip
        elif capped:
            why += (
                f"; not more: {world} GPU(s) share the base config's ~{target:,.0f} tokens per optimizer step"
            )
        if multi_node and tokens == multi_node:
            why = (f"multi-node: fits without activation checkpointing, so fewer accumulation steps; each "
                   f"micro-batch's gradient reduce-scatter crosses the {nodes} nodes")  # fmt: skip
        elif multi_node:
            why += f"; {multi_node} on {nodes} nodes would need activation checkpointing"
        choices.append(Choice("batch_size", config["batch_size"], f"{config['batch_size']} x {seq} tokens ≈ "
                              f"{tokens} tokens per micro-batch ({why})"))  # fmt: skip
    if target:
        mean = sum(lengths.lengths) / len(lengths.lengths)
        per_step = config["batch_size"] * seq * world
        accumulation = max(1, round(target / per_step))
        config["gradient_accumulation_steps"] = accumulation
        base_step = (f"~{target:,.0f} tokens per optimizer step (batch {base.get('batch_size')} x accumulation "
                     f"{base.get('gradient_accumulation_steps')} x {mean:.0f} tokens per row)")  # fmt: skip
        if per_step > GLOBAL_GROWTH_ACCEPTED * target:
            reason = (f"the base config's {base_step} is less than one {config['batch_size'] * seq:,}-token "
                      f"micro-batch on each of {world} GPU(s): the global batch is {per_step:,} tokens, "
                      f"{per_step / target:.1f}x the base's (the learning rate follows it: see learning_rate; set "
                      "tune_batch_size to change it)")  # fmt: skip
        else:
            reason = f"keeps the base config's {base_step} over {world} GPU(s) x {per_step:,} tokens"
        choices.append(Choice("gradient_accumulation_steps", accumulation, reason))
