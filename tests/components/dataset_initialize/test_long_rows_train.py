"""One 100,000-character row, from dataset-initialize to a real short CPU training (the local path, which does
not train on the packs): the fine-tune's tokenizer cuts rows at the packs' length (seq_len.py), so the row is
cut or counted as documented, never a torchtune traceback mid-run (it was `ValueError: seq_len (100015) ...`)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torchtune")

from kfp_finetune.components._shared.contract import DatasetSplit  # noqa: E402
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset  # noqa: E402
from kfp_finetune.components.torchtune_finetune.backends.local import LocalBackend  # noqa: E402
from kfp_finetune.components.torchtune_finetune.finetune import (  # noqa: E402
    ArtifactInput,
    component_settings,
    run_finetune,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("column", ["output", "input"])
def test_one_huge_row_trains_on_cpu_without_a_traceback(tmp_path, tiny_llama, log_lines, capsys, column):
    rows = [{"input": f"question {i}", "output": f"answer {i}"} for i in range(40)]
    rows.insert(20, {"input": "short question", "output": "short answer", column: "lorem ipsum " * 8334})
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workspace = tmp_path / "ws"
    made = initialize_dataset(str(source), str(workspace), base_model_path=tiny_llama)
    split = DatasetSplit.from_metadata(made.train_metadata, input_name="train_data")
    assert split.max_seq_len == 256 and split.token_stats["max"] > 50_000

    settings = component_settings(
        {
            "method": "lora",
            "device": "cpu",
            "batch_size": 2,
            "gradient_accumulation_steps": 1,
            "max_steps_per_epoch": 3,
        }
    )
    result = run_finetune(
        workspace=workspace, train_data=ArtifactInput(dict(made.train_metadata)),
        base_model=ArtifactInput({"workspace_path": str(tiny_llama)}), settings=settings, run_id="r",
        task_name="long-row", backend=LocalBackend(),
    )  # fmt: skip
    assert result.run.config["tokenizer"]["max_seq_len"] == split.max_seq_len  # the packs' length, on CPU too
    assert len(result.steps) == 3 and all(math.isfinite(s.loss) for s in result.steps)
    if column == "input":  # its prompt fills the length: it trains nothing, and says so at both steps
        assert any("left out of the packs" in line and "train.jsonl line 21" in line for line in log_lines)
        # the training process's checks (entrypoint.py), in the step's log
        trained = capsys.readouterr().out.splitlines()
        assert any("1 of 41 training rows" in line and "train_data row 20" in line for line in trained)
