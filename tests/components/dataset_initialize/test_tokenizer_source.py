"""dataset-initialize tokenizes with the base model's tokenizer without waiting for model-initialize: given the
model's URI (base_model_uri) it fetches config.json and the tokenizer files, never the weights, and its packs
carry the same fingerprints as packs made from model-initialize's full copy (so the fine-tune step uses them)."""

import json

import pytest

pytest.importorskip("torchtune")

from kfp_finetune.tiny.dataset import build_tiny_dataset  # noqa: E402
from tests.support.hub_standin import HubStandin  # noqa: E402
from tests.support.sources import hub_env, result, run_python  # noqa: E402

RUN = """
import json, sys
from pathlib import Path
from kfp.dsl import Dataset, Model
from kfp_finetune.components.dataset_initialize.component import dataset_initialize

source, tmp, model = sys.argv[1:4]
train, held_out = Dataset(uri=f"{tmp}/train"), Dataset(uri=f"{tmp}/eval")
inputs = (
    {"base_model": Model(uri=f"{tmp}/model", metadata={"workspace_path": model})}
    if model.startswith("/") else {"base_model_uri": model}
)
dataset_initialize.python_func(
    source_uri=source, workspace_path=f"{tmp}/ws", train=train, eval=held_out, max_seq_len=64, **inputs
)
print(json.dumps(train.metadata))
"""

PACKED = ("tokenizer_fingerprint", "pack_fingerprint", "max_seq_len", "token_stats", "pack_template")


@pytest.mark.slow
def test_packs_from_the_models_uri_match_packs_from_its_full_copy(tiny_llama, tmp_path):
    source = build_tiny_dataset(tmp_path / "tiny", train_rows=60, eval_rows=5)["train.jsonl"]
    with HubStandin() as hub:
        hub.add_repo("org/tiny", tiny_llama)
        env = hub_env(hub.endpoint, tmp_path)
        from_uri = result(run_python(RUN, env, str(source), str(tmp_path / "uri"), "hf://org/tiny"))
        from_copy = result(run_python(RUN, env, str(source), str(tmp_path / "copy"), str(tiny_llama)))
        gets = {name: hub.gets_of(name) for name in ("config.json", "tokenizer.model", "model.safetensors")}
    assert from_uri["packs"] and from_uri["packs"][0]["num_packs"] > 0, json.dumps(from_uri)[:500]
    assert {k: from_uri[k] for k in PACKED} == {k: from_copy[k] for k in PACKED}
    assert [p["sha256"] for p in from_uri["packs"]] == [p["sha256"] for p in from_copy["packs"]]
    assert gets["config.json"] >= 1 and gets["tokenizer.model"] == 1, (
        gets
    )  # (generation_, tokenizer_)config.json
    assert gets["model.safetensors"] == 0, "no weights fetched"
