"""Every proven layout (parity_cases.CASES) computes what transformers computes, in every direction a run's weights
travel (parity.py), within parity.TOLERANCE; and the check fails, by far, on each torchtune 0.6.1 fault the project
corrects, so a passing suite means something.

Runs with transformers 5 and, in `make test-lm-eval`, transformers 4.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune import checkpointer, conversions, families_doc, parity
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node
from kfp_finetune.components._shared.torchtune.parity_cases import CASES, FAMILY_CASES, flags, unproven

pytest.importorskip("transformers")
pytest.importorskip("peft")

DOCS = Path(__file__).parents[4] / "docs" / "families.md"
# Far above fp32 noise, far below what each fault measures (0.19 to 13 on these tiny models).
FAILS_BY_FAR = 1e-2


def expected_unmeasured(case) -> set[str]:
    """The directions a case cannot travel: no PEFT format for the layout, or a LoRA builder refusing it."""
    family = FAMILIES[case.family]
    skipped = set()
    if not conversions.conversion(family.model_type).peft_adapter:
        skipped |= {parity.LORA_PEFT, parity.DORA_PEFT}
    try:
        builder_node(family, case.config, lora=parity.LORA)
    except ConfigError:
        skipped |= {parity.LORA_MERGED, parity.LORA_PEFT, parity.DORA_MERGED, parity.DORA_PEFT}
    return skipped


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
@pytest.mark.slow
def test_each_proven_layout_computes_what_transformers_computes_in_every_direction(case):
    measured = parity.measure(case.config, case.family)
    assert {m.direction for m in measured.measurements} == set(parity.DIRECTIONS)
    assert {m.direction for m in measured.measurements if m.difference is None} == expected_unmeasured(case)
    assert measured.passed, "\n".join(m.line() for m in measured.measurements)


def test_every_family_has_parity_cases():
    assert set(FAMILY_CASES) == set(FAMILIES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_tiny_copy_keeps_every_kind_of_value(case):
    """Only sizes shrink: each field is met by the builder the same way in the tiny model as in the real one."""
    family = FAMILIES[case.family]
    real = {(f.key, f.kind) for f in flags(family, case.config)}
    assert {(f.key, f.kind) for f in flags(family, parity.tiny_config(case.config))} == real


def test_a_kind_of_value_no_case_has_is_unproven_and_named():
    llama3_2 = FAMILY_CASES["llama3_2"].base
    untied = unproven(FAMILIES["llama3_2"], {**llama3_2, "tie_word_embeddings": False})
    assert [(f.key, f.kind) for f in untied] == [("tie_word_embeddings", "carried: false")]
    assert untied[0].line() == "tie_word_embeddings = false (carried: false)"
    uncapped = unproven(FAMILIES["gemma2"], {**FAMILY_CASES["gemma2"].base, "attn_logit_softcapping": None})
    assert [(f.key, f.kind) for f in uncapped] == [("attn_logit_softcapping", "carried: null")]
    assert unproven(FAMILIES["llama3_2"], llama3_2) == []
    # Gemma 3 with global layers only: every real one has local ones too (a layer list is proven by its kinds)
    all_global = {**FAMILY_CASES["gemma3"].base, "layer_types": ["full_attention"] * 26}
    assert [f.line() for f in unproven(FAMILIES["gemma3"], all_global)] == [
        "layer_types = 26 layers: full_attention, repeated (carried: full_attention layers)"
    ]
    assert (
        unproven(
            FAMILIES["gemma3"], {**all_global, "layer_types": ["sliding_attention", "full_attention"] * 13}
        )
        == []
    )


# --- the check fails on each fault it guards against -----------------------------------------------------------


def _shape(config: dict) -> dict:
    """The dimensions torchtune's converters take."""
    heads = config["num_attention_heads"]
    return {
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "dim": config["hidden_size"],
    }


def _torchtune_gemma2_conversion() -> conversions.Conversion:
    """torchtune 0.6.1's own Gemma 2 mapping, its feed-forward norms crossed."""

    def hf_to_tune(state_dict, config):
        from torchtune.models.gemma2._convert_weights import gemma2_hf_to_tune

        return gemma2_hf_to_tune(state_dict, head_dim=config.get("head_dim"), **_shape(config))

    def tune_to_hf(state_dict, config):
        from torchtune.models.gemma2._convert_weights import gemma2_tune_to_hf

        return gemma2_tune_to_hf(state_dict, head_dim=config.get("head_dim"), **_shape(config))

    return conversions.Conversion("GEMMA2", hf_to_tune, tune_to_hf, rope_permuted=True)


def test_torchtune_gemma2_mapping_fails_the_parity_check_by_far(monkeypatch):
    monkeypatch.setitem(conversions.CONVERSIONS, "GEMMA2", _torchtune_gemma2_conversion())
    (load,) = parity.measure(FAMILY_CASES["gemma2"].base, "gemma2", [parity.LOAD]).measurements
    assert load.difference > 0.2, load.line()  # about 0.45


def test_torchtune_gemma2_builder_fails_the_parity_check_by_far(monkeypatch):
    """torchtune's gemma2 soft-caps the hidden state before the output projection, not the logits."""
    torchtune_builders = dataclasses.replace(
        FAMILIES["gemma2"],
        builder="torchtune.models.gemma2.gemma2",
        lora_builder="torchtune.models.gemma2.lora_gemma2",
    )
    monkeypatch.setitem(FAMILIES, "gemma2", torchtune_builders)
    (load,) = parity.measure(FAMILY_CASES["gemma2"].base, "gemma2", [parity.LOAD]).measurements
    assert load.difference > FAILS_BY_FAR, load.line()


def _torchtune_peft_adapter(state_dict, config, layout):
    """torchtune 0.6.1's adapter conversion: q/k LoRA B permuted for every layout, DoRA magnitudes left as they are."""
    from torchtune.models.convert_weights import tune_to_peft_adapter_weights

    return tune_to_peft_adapter_weights(state_dict, head_dim=config.get("head_dim"), **_shape(config))


@pytest.mark.parametrize(
    ("family", "direction"),
    [
        ("qwen2", parity.LORA_PEFT),  # Qwen2's q/k weights are never permuted: neither may their LoRA B be
        ("llama3_2", parity.DORA_PEFT),  # a q/k magnitude follows its weight's rows into HF's order
    ],
)
def test_torchtune_peft_adapter_order_fails_the_parity_check_by_far(monkeypatch, family, direction):
    monkeypatch.setattr(checkpointer, "tune_to_peft_adapter", _torchtune_peft_adapter)
    (measured,) = parity.measure(FAMILY_CASES[family].base, family, [direction]).measurements
    assert measured.difference > FAILS_BY_FAR, measured.line()


@pytest.mark.slow
def test_torchtune_dora_with_biases_fails_the_parity_check_by_far(monkeypatch):
    """torchtune's DoRALinear scales Qwen2's q/k/v biases with the magnitude; the merged model does not."""
    torchtune_lora = dataclasses.replace(FAMILIES["qwen2"], lora_builder="torchtune.models.qwen2.lora_qwen2")
    monkeypatch.setitem(FAMILIES, "qwen2", torchtune_lora)
    (merged,) = parity.measure(FAMILY_CASES["qwen2"].base, "qwen2", [parity.DORA_MERGED]).measurements
    assert merged.difference > FAILS_BY_FAR, merged.line()


def test_docs_family_table_is_current():
    assert DOCS.read_text() == families_doc.markdown(), (
        "docs/families.md is stale: python -m kfp_finetune.components._shared.torchtune.families_doc > "
        "docs/families.md"
    )
