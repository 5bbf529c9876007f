"""docs/families.md, generated from the code: the families, their base configs, methods and proven layouts.

    python -m kfp_finetune.components._shared.torchtune.families_doc > docs/families.md

Everything here is read without torch: the families (model_inspection.FAMILIES), torchtune's recipe registry
(installed), the proven table (parity_cases) and the refusals (model_layout.UNSUPPORTED). Measured
differences stay out (they vary with the CPU); test_parity.py asserts each within parity.TOLERANCE.
"""

from __future__ import annotations

from collections import defaultdict

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune import installed
from kfp_finetune.components._shared.torchtune.conversions import conversion
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node
from kfp_finetune.components._shared.torchtune.model_layout import UNSUPPORTED
from kfp_finetune.components._shared.torchtune.parity import LORA, TOLERANCE
from kfp_finetune.components._shared.torchtune.parity_cases import FAMILY_CASES, flags
from kfp_finetune.components._shared.torchtune.recipes import FINETUNE_RECIPES, config_parts

METHODS = ("full", "lora", "qlora", "dora")
# torchtune 0.6.1 faults the project corrects, each proven by a test in test_parity.py that fails without the fix.
CORRECTIONS = (
    "Gemma 2: its HF mapping swaps the pre- and post-feed-forward norms (conversions.py swaps them back).",
    "Gemma 2: its builders soft-cap the normalized hidden state instead of the logits (torchtune/gemma2.py).",
    "Qwen2 PEFT adapters: q/k LoRA B rows are permuted into a RoPE order Qwen2's weights never had "
    "(conversions.py keeps them).",
    "DoRA PEFT adapters: q/k magnitudes stay in torchtune's row order (conversions.py reorders them), and "
    "adapter_config.json lacks `use_dora` (checkpointer.py writes it).",
    "DoRA with biases (Qwen2's q/k/v): the magnitude scales the bias too (torchtune/dora.py leaves it unscaled).",
)


def base_configs() -> dict[str, dict[str, list[str]]]:
    """family -> size -> the methods torchtune 0.6.1 has a fine-tuning config for (its recipe registry)."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    registry = installed.recipes()
    for recipe in FINETUNE_RECIPES.values():
        for config in registry[recipe].configs:
            family, size, variant = config_parts(config.name)
            method = variant.split("_")[0]
            if method in METHODS:
                found[family][size].add(method)
    return {
        family: {size: sorted(methods, key=METHODS.index) for size, methods in sizes.items()}
        for family, sizes in found.items()
    }


def methods(family: str) -> tuple[list[str], list[str]]:
    """(the methods every parity case of the family accepts, why the others are refused)."""
    family_ = FAMILIES[family]
    lora_refusals = set()
    for case in FAMILY_CASES[family].cases():
        try:
            builder_node(family_, case.config, lora=LORA)
        except ConfigError as error:
            lora_refusals.add(f"lora, qlora, dora: {error}")
    if lora_refusals:
        return ["full"], sorted(lora_refusals)
    return list(METHODS), []


def _sizes(sizes: dict[str, list[str]]) -> str:
    order = sorted(
        sizes, key=lambda size: (not size[0].isdigit(), float(size[:-1]) if size[0].isdigit() else 0)
    )
    return ", ".join(f"{size} ({', '.join(sizes[size])})" for size in order) or "none (any family's nearest)"


def markdown() -> str:
    configs = base_configs()
    out = [
        "# Model families",
        "",
        "Generated from the code (`python -m kfp_finetune.components._shared.torchtune.families_doc > "
        "docs/families.md`); a test keeps it current.",
        "",
        "Every family below is proven equal to Hugging Face transformers, layout by layout: "
        "`tests/components/_shared/torchtune/test_parity.py` builds a tiny random model of each layout listed (a "
        "real checkpoint's config.json with only its sizes shrunk), converts it the way a run does and compares "
        "fp32 logits in every direction a run's weights travel — loaded into torchtune; saved back; LoRA and DoRA "
        f"merged; LoRA and DoRA as PEFT adapters — within a max |Δlogit| of {TOLERANCE:.0e}. A model whose "
        "config.json carries a kind of value no proven layout of its family has is refused by pre-flight, naming "
        "the field; `kfp-finetune check-model --model-dir DIR` measures a model folder's own layout in seconds.",
        "",
        "## Families",
        "",
        "| family | config.json `model_type` | sizes with torchtune 0.6.1 base configs (methods) | methods | "
        "proven layouts |",
        "|---|---|---|---|---|",
    ]
    refusals: dict[str, list[str]] = {}
    for name, entry in FAMILY_CASES.items():
        accepted, refusals[name] = methods(name)
        model_types = sorted({case.config["model_type"] for case in entry.cases()})
        shown_methods = ", ".join(accepted)
        if not conversion(FAMILIES[name].model_type).peft_adapter and accepted != ["full"]:
            shown_methods += " (adapters as torchtune's `adapter_model.pt`: no PEFT format)"
        layouts = "; ".join(case.source for case in entry.cases())
        config_family = FAMILIES[name].config_family
        sizes = _sizes(configs.get(config_family, {}))
        if config_family != name:
            sizes = f"{config_family}'s: {sizes}"
        out.append(f"| {name} | {', '.join(model_types)} | {sizes} | {shown_methods} | {layouts} |")
    out += ["", "## Flags proven", "", "Per family, each config.json field that changes the math and the kinds of "
            "value its proven layouts cover: `carried` (passed to the builder, any number), `neutral` (what the "
            "builder computes anyway), `position limit` (a sliding window the builder cannot apply: runs stay "
            "within it)."]  # fmt: skip
    for name, entry in FAMILY_CASES.items():
        kinds: dict[str, set[str]] = defaultdict(set)
        for case in entry.cases():
            for flag in flags(FAMILIES[name], case.config):
                kinds[flag.key].add(flag.kind)
        out += ["", f"### {name}", ""]
        out += [f"- `{key}`: {', '.join(sorted(kinds[key]))}" for key in sorted(kinds)]
        out += [f"- refused: {why}" for why in refusals[name]]
    out += ["", "## torchtune 0.6.1 faults corrected here", ""]
    out += [f"- {line}" for line in CORRECTIONS]
    out += ["", "## Not supported", "", "| config.json `model_type` | model | why | nearest supported |",
            "|---|---|---|---|"]  # fmt: skip
    out += [f"| {t} | {u.name} | {u.why} | {u.nearest or '-'} |" for t, u in UNSUPPORTED.items()]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
