"""What the run-local terminal shows of the steps' own logs: dataset-initialize's account of the data (columns
dropped, rows cut, row counts) and every step's warnings; other steps' INFO lines stay in the log file."""

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kfp_finetune.cli import main
from kfp_finetune.commands.local_console import QuietConsole

# Lines as kfp.local wrote them into run-local.log for `run-local prepare-inputs` (its task lines, then each
# step's streamed log, indented), the middle of the executor's JSON left out.
RUN_LOCAL_LOG = """\
01:58:17.716 - INFO - Executing task 'model-initialize'
    [KFP Executor 2026-11-25 01:58:17,785 INFO]: Looking for component `model_initialize` in --component_module_path `/tmp/tmp.m7hPdhF79t/ephemeral_component.py`
    01:58:17 INFO kfp_finetune.components.model_initialize.initialize: fetching 7 of 7 files from /tmp/hints/cap/model into models/model-a0a81dea
    01:58:17 INFO kfp_finetune.components._shared.storage.progress: fetch /tmp/hints/cap/model: 7 files, 624.1 KiB
    01:58:17 WARNING kfp_finetune.components._shared.storage.fetch: model.safetensors: size 10 != 12; fetching again
    01:58:17 INFO kfp_finetune.components.model_initialize.initialize: model-a0a81dea is complete: 7 files, 639121 bytes
01:58:17.902 - INFO - Task 'model-initialize' finished with status SUCCESS
01:58:17.904 - INFO - Executing task 'dataset-initialize'
    01:58:18 WARNING kfp_finetune.components.dataset_initialize.sources: found ['json', 'parquet'] files; reading the parquet ones (set data_format to one of json, parquet to choose)
    01:58:18 INFO kfp_finetune.components.dataset_initialize.initialize: loading split 'train' from /tmp/hints/cap/data.jsonl
    01:58:18 INFO kfp_finetune.components.dataset_initialize.initialize: columns not used by input_output data, dropped: note
    01:58:18 INFO kfp_finetune.components.dataset_initialize.initialize: datasets/data-c54ccf15/train: 75 rows in 1 shard(s)
    01:58:18 INFO kfp_finetune.components.dataset_initialize.initialize: datasets/data-c54ccf15/eval: 4 rows in 1 shard(s)
    [KFP Executor 2026-11-25 01:58:21,074 WARNING]: Warning: Detected no triton, on systems without Triton certain kernels will not work
    01:58:21 INFO kfp_finetune.components._shared.torchtune.packing: 1 row(s) longer than max_seq_len 256 are cut to it
    01:58:21 INFO kfp_finetune.components.dataset_initialize.packs: max_seq_len 256 (set); 7 packs in 0.0s; 1 row(s) cut to it
01:58:22.253 - INFO - Task 'dataset-initialize' finished with status SUCCESS
01:58:22.254 - INFO - Pipeline 'prepare-inputs' finished with status SUCCESS
"""


def test_the_terminal_shows_dataset_initialize_and_warnings_and_the_log_keeps_everything():
    terminal, log = io.StringIO(), io.StringIO()
    console = QuietConsole(terminal, log)
    console.write(RUN_LOCAL_LOG)
    shown = terminal.getvalue().splitlines()
    assert shown[:2] == [
        "  model-initialize: started",
        "    warning: model.safetensors: size 10 != 12; fetching again",
    ]
    assert shown[3:] == [
        "  dataset-initialize: started",
        "    warning: found ['json', 'parquet'] files; reading the parquet ones (set data_format to one of json, "
        "parquet to choose)",
        "    loading split 'train' from /tmp/hints/cap/data.jsonl",
        "    columns not used by input_output data, dropped: note",
        "    datasets/data-c54ccf15/train: 75 rows in 1 shard(s)",
        "    datasets/data-c54ccf15/eval: 4 rows in 1 shard(s)",
        "    1 row(s) longer than max_seq_len 256 are cut to it",
        "    max_seq_len 256 (set); 7 packs in 0.0s; 1 row(s) cut to it",
        shown[-1],
    ]
    assert shown[2].startswith("  model-initialize: done in ") and shown[-1].startswith(
        "  dataset-initialize: done"
    )
    assert log.getvalue() == RUN_LOCAL_LOG  # the log file has every line


@pytest.mark.slow
def test_run_local_prepare_inputs_shows_what_dataset_initialize_did(tiny_llama, tmp_path, capfd):
    rows = [{"input": f"Uppercase: {c} a", "output": f"{c.upper()} A", "note": "x"} for c in "abcdefghij" * 4]
    rows.append({"input": "long " * 2000, "output": "B", "note": "y"})
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    code = main([
        "run-local", "prepare-inputs", "--output", str(tmp_path / "out"),
        "--param", f"model_uri={tiny_llama}", "--param", f"data_uri={folder}", "--param", "tune_max_seq_len=256",
        "--param", "data_eval_fraction=0",  # every row trains: the long one is cut
    ])  # fmt: skip
    out = capfd.readouterr().out
    assert code == 0, out
    shown = out.splitlines()
    assert "    warning: found ['json', 'parquet'] files; reading the parquet ones" in out, out
    assert "    columns not used by input_output data, dropped: note" in shown, out
    assert any(line.endswith("/train: 41 rows in 1 shard(s)") for line in shown), out
    assert any("left out of the packs: 1 of 41 training rows" in line for line in shown), out
    assert not any("fetching" in line for line in shown), "model-initialize's INFO lines stay in the log"
    log = (tmp_path / "out" / "run-local.log").read_text()
    assert "fetching" in log and "Got executor_input" in log
