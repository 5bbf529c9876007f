"""dataset-initialize's hints can be followed: each message names a pipeline parameter, and setting it makes the
data load.

Every step here runs the component as a pipeline runs it: the data_ parameters of the one parameter table (their
defaults, plus what the test sets) turned into the component's arguments by `Values.feeding`, passed to the
component function, which fails with one `error:` line (usage_errors) for input the user can fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.dataset_initialize.initialize import iter_rows
from kfp_finetune.pipelines.parameters import PARAMETERS, REQUIRED, TABLE, Values
from tests.support.hub_standin import HubStandin
from tests.support.sources import hub_env, moto_s3, result, run_python, use_s3_credentials

ROWS = [{"input": f"question {i}", "output": f"answer {i}"} for i in range(40)]


def step(tmp_path: Path, data_uri: str | Path, **settings) -> SimpleNamespace:
    """Run dataset-initialize with the pipeline's data_ parameters (table defaults + `settings`)."""
    values = {p.name: p.default for p in TABLE if p.group == "data" and p.default is not REQUIRED}
    unknown = set(settings) - set(PARAMETERS)
    assert not unknown, f"not pipeline parameters: {unknown}"
    values.update(data_uri=str(data_uri), **settings)
    outputs = {
        split: SimpleNamespace(path=str(tmp_path / "artifacts" / split), metadata={})
        for split in ("train", "eval")
    }
    dataset_initialize.python_func(
        workspace_path=str(tmp_path / "workspace"), **outputs, **Values(values).feeding("dataset_initialize")
    )
    return SimpleNamespace(**{split: out.metadata for split, out in outputs.items()})


def error_line(capsys, tmp_path: Path, data_uri: str | Path, **settings) -> str:
    """The one `error:` line of a step that refuses its input."""
    with pytest.raises(SystemExit):
        step(tmp_path, data_uri, **settings)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


def rows_of(metadata: dict, tmp_path: Path) -> list[dict]:
    return list(iter_rows([tmp_path / "workspace" / f for f in metadata["data_files"]]))


def delimited(rows: list[dict], separator: str) -> str:
    lines = [separator.join(rows[0]), *(separator.join(row.values()) for row in rows)]
    return "\n".join(lines) + "\n"


def test_a_tsv_file_is_read_tab_separated_and_other_names_take_data_format(tmp_path, capsys):
    (tmp_path / "train.tsv").write_text(delimited(ROWS, "\t"))
    out = step(tmp_path, tmp_path / "train.tsv", data_eval_fraction=0.0)
    assert rows_of(out.train, tmp_path) == ROWS

    (tmp_path / "export.dat").write_text(delimited(ROWS, "\t"))
    line = error_line(capsys, tmp_path, tmp_path / "export.dat")
    assert "set data_format" in line and "tsv" in line, line
    out = step(tmp_path, tmp_path / "export.dat", data_format="tsv", data_eval_fraction=0.0)
    assert rows_of(out.train, tmp_path) == ROWS


def test_a_semicolon_csv_names_data_csv_delimiter_and_loads_with_it(tmp_path, capsys):
    rows = [*ROWS[:5], {"input": "question 5", "output": ""}, *ROWS[6:]]  # one empty output, at line 7
    source = tmp_path / "data.csv"
    source.write_text(delimited(rows, ";"))
    line = error_line(capsys, tmp_path, source)
    assert "data.csv line 1" in line and "data_csv_delimiter=;" in line, line

    # With the delimiter the columns are found, and a bad row is named by its line in the file.
    line = error_line(capsys, tmp_path, source, data_csv_delimiter=";")
    assert "data.csv line 7" in line, line
    source.write_text(delimited(ROWS, ";"))
    out = step(tmp_path, source, data_csv_delimiter=";", data_eval_fraction=0.0)
    assert rows_of(out.train, tmp_path) == ROWS


@pytest.mark.parametrize("spelled", ["\\t", "tab", "\t"])
def test_a_tab_delimiter_can_be_typed_in_a_text_field(tmp_path, spelled):
    (tmp_path / "data.csv").write_text(delimited(ROWS, "\t"))
    out = step(tmp_path, tmp_path / "data.csv", data_csv_delimiter=spelled, data_eval_fraction=0.0)
    assert rows_of(out.train, tmp_path) == ROWS


def test_a_bad_delimiter_is_refused_naming_the_parameter(tmp_path, capsys):
    (tmp_path / "data.csv").write_text(delimited(ROWS, ","))
    line = error_line(capsys, tmp_path, tmp_path / "data.csv", data_csv_delimiter=";;")
    assert "data_csv_delimiter must be one character" in line, line


def test_a_json_and_parquet_folder_names_data_format_and_reads_the_chosen_files(tmp_path, capsys, log_lines):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    pq.write_table(pa.Table.from_pylist([{"id": i} for i in range(3)]), folder / "stats.parquet")
    error_line(capsys, tmp_path, folder)  # the parquet file is read, and it has no input/output columns
    assert any("set data_format to one of json, parquet" in line for line in log_lines), log_lines
    out = step(tmp_path, folder, data_format="jsonl", data_eval_fraction=0.0)
    assert rows_of(out.train, tmp_path) == ROWS


CARD = """---
configs:
- config_name: en
  data_files:
  - split: train
    path: en/train.jsonl
  - split: test
    path: en/test.jsonl
- config_name: fr
  data_files:
  - split: train
    path: fr/*.jsonl
---
# two languages
"""


def two_config_folder(folder: Path) -> dict[str, list[dict]]:
    """A dataset folder as the Hub holds one with two configs: {file: rows}."""
    content = {
        "en/train.jsonl": ROWS[:30],
        "en/test.jsonl": ROWS[30:],
        "fr/part-0.jsonl": [{"input": f"question {i}", "output": f"réponse {i}"} for i in range(10)],
    }
    for name, rows in content.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    (folder / "README.md").write_text(CARD)
    return content


def test_a_folder_with_two_configs_names_data_subset_and_reads_the_chosen_config(tmp_path, capsys):
    content = two_config_folder(tmp_path / "repo")
    line = error_line(capsys, tmp_path, tmp_path / "repo")
    assert "2 configs (en, fr" in line and "set data_subset" in line, line

    fr = step(tmp_path, tmp_path / "repo", data_subset="fr", data_eval_fraction=0.0)
    assert rows_of(fr.train, tmp_path) == content["fr/part-0.jsonl"]
    en = step(tmp_path, tmp_path / "repo", data_subset="en", data_eval_split="test")
    assert rows_of(en.train, tmp_path) == content["en/train.jsonl"]
    assert rows_of(en.eval, tmp_path) == content["en/test.jsonl"]

    line = error_line(capsys, tmp_path, tmp_path / "repo", data_subset="de")
    assert "data_subset='de' is not a config" in line and "en, fr" in line, line
    line = error_line(capsys, tmp_path, tmp_path / "repo" / "en", data_subset="en")
    assert "data_subset='en'" in line and "no configs" in line, line


@pytest.mark.slow
def test_an_s3_copy_of_a_two_config_folder_reads_the_chosen_config(tmp_path, monkeypatch):
    use_s3_credentials(monkeypatch)
    content = two_config_folder(tmp_path / "repo")
    with moto_s3() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="data")
        for path in (tmp_path / "repo").rglob("*"):
            if path.is_file():
                client.upload_file(
                    str(path), "data", f"langs/{path.relative_to(tmp_path / 'repo').as_posix()}"
                )
        out = step(
            tmp_path, "s3://data/langs", data_subset="fr", data_eval_fraction=0.0, s3_endpoint_url=endpoint
        )
    assert rows_of(out.train, tmp_path) == content["fr/part-0.jsonl"]


STEP_FROM_HUB = """
    import json, sys
    from types import SimpleNamespace
    from kfp_finetune.components.dataset_initialize.component import dataset_initialize

    train = SimpleNamespace(path=sys.argv[2] + "/train.json", metadata={})
    eval_ = SimpleNamespace(path=sys.argv[2] + "/eval.json", metadata={})
    try:
        dataset_initialize.python_func(
            workspace_path=sys.argv[2], train=train, eval=eval_, **json.loads(sys.argv[1])
        )
        print(json.dumps({"train": train.metadata["num_rows"], "eval": eval_.metadata["num_rows"]}))
    except SystemExit:
        print(json.dumps({"refused": True}))
"""


@pytest.mark.slow
def test_a_hub_dataset_with_two_configs_names_data_subset_and_loads_with_it(tmp_path):
    two_config_folder(tmp_path / "repo")
    with HubStandin() as hub:
        hub.add_repo("org/langs", tmp_path / "repo", repo_type="dataset")
        env = hub_env(hub.endpoint, tmp_path)

        def run(**settings):
            values = {p.name: p.default for p in TABLE if p.group == "data" and p.default is not REQUIRED}
            values.update(data_uri="hf://org/langs", **settings)
            arguments = json.dumps(Values(values).feeding("dataset_initialize"))
            return run_python(STEP_FROM_HUB, env, arguments, str(tmp_path / "workspace"))

        refused = run()
        chosen = result(run(data_subset="en", data_eval_split="test"))
    assert json.loads(refused.stdout.strip().splitlines()[-1]) == {"refused": True}
    error = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "hf://org/langs has 2 configs (en, fr): set data_subset" in error[0], error
    assert chosen == {"train": 30, "eval": 10}


# --- the held-out split ---------------------------------------------------------------------------------------


def split_folder(folder: Path) -> Path:
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    (folder / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS[:7]))
    return folder


def test_data_eval_split_alone_is_the_held_out_split(tmp_path):
    assert PARAMETERS["data_eval_fraction"].default == -1  # unset: the default counts as not set
    out = step(tmp_path, split_folder(tmp_path / "d"), data_eval_split="test")
    assert (out.train["num_rows"], out.eval["num_rows"]) == (40, 7)
    assert out.eval["source_split"] == "test"


@pytest.mark.slow
def test_data_eval_split_alone_through_the_prepare_inputs_pipeline(tiny_llama, tmp_path):
    """The same through kfp.local: the compiled pipeline passes its defaults and the one parameter set."""
    from kfp_finetune.commands.run_local import run_pipeline_locally
    from kfp_finetune.pipelines import PIPELINES

    arguments = {"model_uri": str(tiny_llama), "data_uri": str(split_folder(tmp_path / "d"))}
    task = run_pipeline_locally(
        PIPELINES["prepare-inputs"], {**arguments, "data_eval_split": "test"}, tmp_path
    )
    train, eval_ = task.outputs["train"].metadata, task.outputs["eval"].metadata
    assert (train["num_rows"], eval_["num_rows"], eval_["source_split"]) == (40, 7, "test")


def test_without_a_named_split_the_default_holds_out_five_percent(tmp_path):
    out = step(tmp_path, split_folder(tmp_path / "d"))
    assert (out.train["num_rows"], out.eval["num_rows"]) == (38, 2)
    assert out.eval["source_split"] == "train (held-out 0.05, seed 42)"


@pytest.mark.parametrize("fraction, rows", [(0.0, 0), (0.25, 10)])
def test_a_fraction_set_without_a_split_is_used(tmp_path, fraction, rows):
    out = step(tmp_path, split_folder(tmp_path / "d"), data_eval_fraction=fraction)
    assert out.eval["num_rows"] == rows


def test_a_named_split_and_a_fraction_both_set_conflict(tmp_path, capsys):
    line = error_line(
        capsys, tmp_path, split_folder(tmp_path / "d"), data_eval_split="test", data_eval_fraction=0.1
    )
    assert "data_eval_split='test' and data_eval_fraction=0.1 both choose the held-out rows" in line, line
    line = error_line(capsys, tmp_path, tmp_path / "d", data_eval_fraction=1.5)
    assert "data_eval_fraction must be in [0, 1), or -1" in line, line


def test_a_held_out_share_that_leaves_no_training_rows_names_data_eval_fraction(tmp_path, capsys):
    (tmp_path / "one.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    line = error_line(capsys, tmp_path, tmp_path / "one.jsonl")
    assert "data_eval_fraction=0.05 of 1 row(s) leaves none to train on" in line, line
    out = step(tmp_path, tmp_path / "one.jsonl", data_eval_fraction=0.0)
    assert (out.train["num_rows"], out.eval["num_rows"]) == (1, 0)
