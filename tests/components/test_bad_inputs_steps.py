"""Bad inputs to torchtune-finetune, evaluate, export, gpu-counts and the CLI (issue 16 item 7), one table row each.

Each row calls the plain-Python entry point (run_finetune, evaluate's run_component, export_model, the CLI's
main()) and expects an error of a class the component's `usage_errors(...)` prints as one line, naming the
parameter / file and the fix; and that nothing started: no training (the backend's run is never reached), no run
folder, no eval or export folder. dataset- and model-initialize rows are in test_bad_inputs_data.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kfp_finetune.cli import main
from kfp_finetune.components._shared.errors import ContractError
from kfp_finetune.components._shared.storage import StorageError
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.evaluate import evaluate
from kfp_finetune.components.export.export import ExportError, export_model
from kfp_finetune.components.gpu_counts.component import gpu_counts
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.components.torchtune_finetune.finetune import USAGE_ERRORS, ArtifactInput, run_finetune
from tests.components.test_bad_inputs_data import assert_message


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_llama, tiny_dataset):
    """A workspace holding a dataset and a model as the initializers write them, and their artifacts' metadata."""
    workspace = tmp_path_factory.mktemp("bad-inputs") / "workspace"
    data = initialize_dataset(str(tiny_dataset["train.jsonl"]), str(workspace), name="tiny")
    model = initialize_model(str(tiny_llama), str(workspace), name="tiny-llama")
    return SimpleNamespace(workspace=workspace, train=data.train_metadata, model=model.metadata)


def entries(workspace: Path) -> set[str]:
    return {p.relative_to(workspace).as_posix() for p in workspace.rglob("*")}


# --- torchtune-finetune ---------------------------------------------------------------------------------------


class RecordingBackend:
    """A backend that records what reached it; a bad input must be refused before `run`."""

    name, devices, nodes = "recording", 1, 1

    def __init__(self):
        self.ran = []

    def gpus_available(self) -> bool:
        return False

    def prepare(self, run_dir: Path, *, resume_point=None) -> None:
        pass

    def run(self, resolved, *, total_steps):
        self.ran.append(resolved)
        raise AssertionError("training started for a bad input")


def no_workspace_path(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k != "workspace_path"}


# (id, settings, how to change (train metadata, model metadata), message fragments)
FINETUNE_ROWS = [
    ("unknown-method", {"method": "sft"}, None, ["method", "full", "lora", "'sft'"]),
    ("negative-learning-rate", {"learning_rate": -1e-4}, None, ["learning_rate", "> 0"]),
    ("negative-weight-decay", {"weight_decay": -0.1}, None, ["weight_decay", ">= 0", "-0.1"]),
    ("seed-below-minus-one", {"seed": -5}, None, ["seed", "-5", "0 or more"]),
    ("batch-size-negative", {"batch_size": -1}, None, ["batch_size", "at least 1"]),
    ("epochs-zero", {"epochs": 0}, None, ["epochs", "at least 1"]),
    ("grad-accumulation-zero", {"gradient_accumulation_steps": 0}, None, ["gradient_accumulation_steps"]),
    ("max-steps-zero", {"max_steps_per_epoch": 0}, None, ["max_steps_per_epoch", "at least 1"]),
    ("warmup-negative", {"num_warmup_steps": -2}, None, ["num_warmup_steps", ">= 0"]),
    ("log-every-zero", {"log_every_n_steps": 0}, None, ["log_every_n_steps", "at least 1"]),
    ("lora-rank-negative", {"lora_rank": -3}, None, ["lora_rank", "at least 1"]),
    ("lora-alpha-negative", {"lora_alpha": -16}, None, ["lora_alpha", "> 0"]),
    ("lora-dropout-over-one", {"lora_dropout": 1.5}, None, ["lora_dropout", "[0, 1)"]),
    ("unknown-lora-module", {"lora_attn_modules": ["foo"]}, None, ["lora_attn_modules", "foo", "q_proj"]),
    ("unknown-dtype", {"dtype": "fp8"}, None, ["dtype", "'fp8'"]),
    ("unknown-device", {"device": "tpu"}, None, ["device", "'tpu'"]),
    ("misspelt-setting", {"learning_rat": 1e-4}, None, ["unknown setting 'learning_rat'", "learning_rate"]),
    (
        "another-engines-setting",
        {"lora_target_parameters": ["mlp.experts.down_proj"]},
        None,
        ["lora_target_parameters is not read by torchtune", "tune_engine=transformers"],
    ),
    (
        "qlora-without-quantize",
        {"method": "qlora", "quantize_base": False},
        None,
        ["quantize_base must not be false", "method=lora"],
    ),
    ("adapter-only-full", {"method": "full", "save_adapter_weights_only": True}, None, ["method=full"]),
    (
        "packed-without-max-seq-len",
        {"packed": True},
        None,
        ["packed needs a sequence length", "tune_max_seq_len"],
    ),
    # max_seq_len shorter than the prompts needs torch to know: refused where training runs, before it starts
    # (tests/components/torchtune_finetune/test_light_launcher.py).
    (
        "non-numeric-clip-grad-norm",
        {"overrides": {"clip_grad_norm": "abc"}},
        None,
        ["clip_grad_norm", "'abc'", "number"],
    ),
    (
        "non-numeric-optimizer-lr",
        {"overrides": {"optimizer.lr": "x"}},
        None,
        ["optimizer.lr", "'x'", "number"],
    ),
    (
        "override-unknown-key",
        {"overrides": {"optimizer.lrr": 1e-4}},
        None,
        ["optimizer.lrr", "+optimizer.lrr"],
    ),
    ("overrides-not-a-mapping", {"overrides": ["lr=1"]}, None, ["overrides", "mapping"]),
    ("not-a-finetune-recipe", {"recipe": "generate"}, None, ["recipe 'generate'", "finetune"]),
    ("unknown-conversation-style", {"conversation_style": "alpaca"}, None, ["conversation_style", "openai"]),
    ("unknown-data-style", {"data_style": "qa"}, None, ["data_style", "input_output"]),
    (
        "dataset-type-contradicts-data",
        {"dataset_type": "chat"},
        None,
        ["dataset_type 'chat'", "train_data", "'instruct'", "dataset-initialize"],
    ),
    (
        # Image + text rows train a vision-language model; the tiny Llama is none, and torchtune trains text only.
        "multimodal-data-on-a-text-model",
        {},
        lambda t, m: ({**t, "dataset_type": "multimodal", "num_images": 3, "image_column": "images"}, m),
        ["no engine can fine-tune this model", "image-text-to-text", "data_type", "vision-language"],
    ),
    (
        # Classification data goes to the transformers engine (torchtune trains text generation only), which
        # refuses a torchtune setting by its pipeline name before anything is written.
        "classification-data-with-a-torchtune-setting",
        {"recipe": "lora_finetune_single_device"},
        lambda t, m: ({**t, "dataset_type": "classification", "num_labels": 5, "label_column": "label"}, m),
        ["tune_recipe", "torchtune setting", "transformers engine"],
    ),
    (
        "column-map-contradicts-data",
        {"column_map": {"input": "question"}},
        None,
        ["column_map", "'question'", "train_data", "columns"],
    ),
    (
        "base-model-not-connected",
        {},
        lambda t, m: (t, no_workspace_path(m)),
        ["base_model", "workspace_path", "model-initialize"],
    ),
    (
        "train-data-not-connected",
        {},
        lambda t, m: ({k: v for k, v in t.items() if k != "data_files"}, m),
        ["train_data", "data_files", "dataset-initialize"],
    ),
    (
        "train-data-files-missing",
        {},
        lambda t, m: ({**t, "data_files": ["datasets/gone/train/part-00000-of-00001.parquet"]}, m),
        ["train_data", "missing", "part-00000-of-00001.parquet"],
    ),
    (
        "base-model-folder-missing",
        {},
        lambda t, m: (t, {**m, "workspace_path": "models/gone"}),
        ["base_model", "models/gone", "does not exist"],
    ),
]


@pytest.mark.parametrize(
    ("settings", "change", "fragments"), [r[1:] for r in FINETUNE_ROWS], ids=[r[0] for r in FINETUNE_ROWS]
)
def test_finetune_refuses(prepared, settings, change, fragments):
    train, model = (change or (lambda t, m: (t, m)))(dict(prepared.train), dict(prepared.model))
    backend = RecordingBackend()
    before = entries(prepared.workspace)
    with pytest.raises(USAGE_ERRORS) as caught:
        run_finetune(
            workspace=prepared.workspace,
            train_data=ArtifactInput(train, ""),
            base_model=ArtifactInput(model, ""),
            settings=json.loads(json.dumps(settings)),
            run_id="bad-input",
            task_name="torchtune-finetune",
            backend=backend,
            export_format="merged" if settings.get("method") == "full" else "",
        )
    assert_message(caught.value, fragments)
    assert backend.ran == []
    assert entries(prepared.workspace) == before  # no run folder, no resolved config


def test_finetune_export_format_refused(prepared):
    backend = RecordingBackend()
    with pytest.raises(USAGE_ERRORS) as caught:
        run_finetune(
            workspace=prepared.workspace,
            train_data=ArtifactInput(dict(prepared.train), ""),
            base_model=ArtifactInput(dict(prepared.model), ""),
            settings={},
            run_id="bad-input",
            task_name="torchtune-finetune",
            backend=backend,
            export_format="onnx",
        )
    assert_message(caught.value, ["export_format", "'onnx'", "merged"])
    assert backend.ran == [] and not (prepared.workspace / "runs").exists()


# --- evaluate -------------------------------------------------------------------------------------------------

# (id, evaluate parameters, message fragments)
EVALUATE_ROWS = [
    ("batch-size-zero", {"batch_size": 0}, ["batch_size", "at least 1"]),
    ("max-new-tokens-zero", {"max_new_tokens": 0}, ["max_new_tokens", "at least 1"]),
    ("max-samples-negative", {"max_samples": -1}, ["max_samples", "0 or more"]),
    ("max-seq-len-negative", {"max_seq_len": -8}, ["max_seq_len", "0 or more"]),
    ("lm-eval-limit-negative", {"lm_eval_limit": -1}, ["lm_eval_limit", "0 or more"]),
    ("report-samples-negative", {"report_samples": -3}, ["report_samples", "0 or more"]),
    ("unknown-device", {"device": "tpu"}, ["device", "'tpu'", "cpu"]),
    ("unknown-gate-metric", {"gate_metric": "recall"}, ["gate_metric", "recall", "eval_loss"]),
    ("unknown-threshold-metric", {"thresholds": {"bleu": 0.3}}, ["thresholds", "bleu"]),
    ("non-numeric-threshold", {"thresholds": {"exact_match": "high"}}, ["thresholds", "numbers", "'high'"]),
    ("confidence-one", {"confidence": 1.0}, ["confidence must be", "between 0 and 1", "0.95"]),
    ("confidence-percent", {"confidence": 95}, ["confidence must be", "between 0 and 1", "got 95"]),
    ("model-not-connected", {"model_metadata": {}}, ["model", "workspace_path"]),
]


@pytest.mark.parametrize(
    ("params", "fragments"), [r[1:] for r in EVALUATE_ROWS], ids=[r[0] for r in EVALUATE_ROWS]
)
def test_evaluate_refuses(tmp_path, workspace, params, fragments):
    params = dict(params)
    model_meta = params.pop(
        "model_metadata", {"workspace_path": "runs/x/merged", "merged_path": "runs/x/merged"}
    )
    outputs = {n: SimpleNamespace(path=str(tmp_path / "out" / n), metadata={}) for n in ("report", "samples")}
    with pytest.raises(evaluate.ConfigError) as caught:
        evaluate.run_component(
            workspace_path=str(workspace),
            model=SimpleNamespace(metadata=model_meta, path=""),
            eval_data=SimpleNamespace(metadata={"data_files": []}, path=""),
            base_model=None,
            run_id="bad-input",
            task_name="evaluate",
            metrics=None,
            **outputs,
            **params,
        )
    assert_message(caught.value, fragments)
    assert entries(workspace) == set()  # no eval folder
    assert not (tmp_path / "out").exists()


# --- export ---------------------------------------------------------------------------------------------------

LORA = {
    "method": "lora",
    "merged_path": "runs/r/merged",
    "adapter_path": "runs/r/adapter",
    "run_dir": "runs/r",
}

# (id, export_model arguments, message fragments)
EXPORT_ROWS = [
    ("unknown-format", {"format": "gguf"}, ["format must be one of", "(got 'gguf')", "merged"]),
    ("unknown-dtype", {"dtype": "int3"}, ["dtype must be", "(got 'int3')", "bf16"]),
    ("unsupported-destination", {"destination": "ftp://host/models/x"}, ["ftp"]),
    ("https-destination", {"destination": "https://example.com/models/x"}, ["cannot export", "s3://"]),
    ("bucket-root", {"destination": "s3://bucket"}, ["s3://bucket", "name a folder"]),
    ("filesystem-root", {"destination": "/"}, ["'/'", "name a folder"]),
    (
        "adapter-of-full",
        {"format": "adapter", "model_metadata": {**LORA, "method": "full", "adapter_path": ""}},
        ["full fine-tune has no adapter", "format=merged"],
    ),
    (
        "merged-of-adapter-only-without-its-base",
        {"model_metadata": {**LORA, "merged_path": ""}},
        ["needs the base model to merge the adapter into", "base_model_path", "set export_format=adapter"],
    ),
    (
        "merged-of-nothing",
        {"model_metadata": {**LORA, "merged_path": "", "adapter_path": ""}},
        [
            "needs merged weights",
            "neither merged weights nor an adapter",
            "torchtune-finetune's model output",
        ],
    ),
    ("hf-without-token", {"destination": "hf://org/tuned"}, ["HF_TOKEN"]),
    ("model-folder-missing", {}, ["merged model folder", "merged_path", "not in the workspace"]),
]


@pytest.mark.parametrize(
    ("kwargs", "fragments"), [r[1:] for r in EXPORT_ROWS], ids=[r[0] for r in EXPORT_ROWS]
)
def test_export_refuses(tmp_path, workspace, monkeypatch, kwargs, fragments):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    destination = tmp_path / "exported"
    output = SimpleNamespace(path=str(tmp_path / "out" / "model"), metadata={}, uri="")
    kwargs = {"model_metadata": LORA, "destination": str(destination), **kwargs}
    with pytest.raises((ExportError, StorageError)) as caught:
        export_model(workspace=workspace, output=output, **kwargs)
    assert_message(caught.value, fragments)
    assert entries(workspace) == set()  # no staging folder
    assert not destination.exists() and not output.metadata


def test_export_refuses_a_model_artifact_of_another_shape(tmp_path, workspace):
    """Metadata that is not a tuned model's (contract.TunedModel) fails naming the input and what to connect."""
    output = SimpleNamespace(path=str(tmp_path / "out" / "model"), metadata={}, uri="")
    with pytest.raises(ContractError) as caught:
        export_model(
            workspace=workspace,
            output=output,
            model_metadata={**LORA, "merged_path": ["runs/r/merged"]},
            destination=str(tmp_path / "exported"),
        )
    assert_message(caught.value, ["model", "'merged_path'", "a string", "torchtune-finetune's model output"])
    assert entries(workspace) == set() and not output.metadata


# --- gpu-counts -----------------------------------------------------------------------------------------------

# (id, gpu-counts parameters, the one line on stderr)
GPU_COUNTS_ROWS = [
    (
        "tune-gpus-negative",
        {"tune_gpus_per_node": -1},
        "error: tune_gpus_per_node must be 0 (CPU training) or more (got -1)",
    ),
    (
        "eval-gpus-below-minus-one",
        {"tune_gpus_per_node": 2, "eval_gpus": -3},
        "error: eval_gpus must be -1 (one GPU when the fine-tune used GPUs) or 0 or more (got -3)",
    ),
]


@pytest.mark.parametrize(
    ("params", "line"), [r[1:] for r in GPU_COUNTS_ROWS], ids=[r[0] for r in GPU_COUNTS_ROWS]
)
def test_gpu_counts_refuses(capsys, params, line):
    """The component body, as KFP runs it: one `error:` line and exit status 1, no traceback."""
    with pytest.raises(SystemExit) as ended:
        gpu_counts.python_func(**params)
    assert ended.value.code == 1
    assert capsys.readouterr().err.strip() == line


# --- the CLI --------------------------------------------------------------------------------------------------

# (id, arguments after `kfp-finetune` ({model} and {tmp} are filled in), exit status, stderr fragments)
CLI_ROWS = [
    ("unknown-command", ["fine-tune"], 2, ["invalid choice", "'fine-tune'"]),
    ("missing-model-dir", ["resolve-config"], 2, ["--model-dir"]),
    ("model-dir-does-not-exist", ["resolve-config", "--model-dir", "{tmp}/nope"], 2, ["nope"]),
    (
        "unknown-method",
        ["resolve-config", "--model-dir", "{model}", "--method", "sft"],
        2,
        ["--method", "'sft'"],
    ),
    (
        "devices-not-a-number",
        ["resolve-config", "--model-dir", "{model}", "--devices", "two"],
        2,
        ["--devices", "'two'"],
    ),
    (
        "devices-zero",
        ["resolve-config", "--model-dir", "{model}", "--devices", "0"],
        2,
        ["devices", "at least 1"],
    ),
    (
        "set-without-value",
        ["resolve-config", "--model-dir", "{model}", "--set", "lora_rank"],
        2,
        ["--set", "KEY=VALUE", "'lora_rank'"],
    ),
    (
        "set-negative-weight-decay",
        ["resolve-config", "--model-dir", "{model}", "--data", "{data}", "--set", "weight_decay=-1"],
        2,
        ["weight_decay", ">= 0"],
    ),
    (
        "set-non-numeric-override",
        ["resolve-config", "--model-dir", "{model}", "--data", "{data}", "--set", "clip_grad_norm=abc"],
        2,
        ["clip_grad_norm", "'abc'"],
    ),
    (
        "data-does-not-exist",
        ["resolve-config", "--model-dir", "{model}", "--data", "{tmp}/nope.jsonl"],
        2,
        ["nope.jsonl", "does not exist"],
    ),
    (
        "data-of-unknown-type",
        ["resolve-config", "--model-dir", "{model}", "--data", "{tmp}/data.xml"],
        2,
        ["data.xml", "unsupported type"],
    ),
    *(
        (
            f"trainjob-{row_id}",
            ["trainjob", "--dry-run", "--model-dir", "{model}", "--data", "{data}", *flags],
            2,
            fragments,
        )  # fmt: skip
        for row_id, flags, fragments in [
            ("timeout-negative", ["--timeout", "-1"], ["--timeout", "0 (no limit) or more", "got -1"]),
            ("gpus-negative", ["--gpus", "-1"], ["--gpus", "0 (CPU) or more", "got -1"]),
            ("nodes-zero", ["--nodes", "0"], ["--nodes", "at least 1", "got 0"]),
            ("namespace-not-a-name", ["--namespace", "Team_A"], ["--namespace", "'Team_A'", "lowercase"]),
            ("runtime-not-a-name", ["--runtime", "my runtime"], ["--runtime", "'my runtime'", "253"]),
            (
                "pvc-not-a-name",
                ["--workspace-pvc", "ws-"],
                ["--workspace-pvc", "'ws-'", "starting and ending"],
            ),
            ("image-not-a-reference", ["--image", "Trainer:latest"], ["--image", "image reference", "lower"]),
        ]
    ),
    (
        "params-file-not-yaml",
        ["run", "prepare-inputs", "--params-file", "{tmp}/broken.yaml", "--host", "http://127.0.0.1:9"],
        2,
        ["--params-file", "broken.yaml", "not valid YAML", "line 2, column 1"],
    ),
    (
        "params-file-not-utf8",
        ["run", "prepare-inputs", "--params-file", "{tmp}/latin1.yaml", "--host", "http://127.0.0.1:9"],
        2,
        ["--params-file", "latin1.yaml", "not UTF-8", "save it as UTF-8"],
    ),
    (
        "cpu-distributed",
        ["resolve-config", "--model-dir", "{model}", "--devices", "2", "--device", "cpu"],
        2,
        ["distributed", "CPU"],
    ),
    (
        "run-local-presigned-data-uri",
        [
            "run-local",
            "finetune-pipeline",
            "--param",
            "data_uri=https://127.0.0.1:9/t.jsonl?X-Amz-Signature=s",
        ],
        2,
        [
            "--param data_uri",
            "carries credentials",
            "KFP prints every pipeline parameter",
            "Kubernetes Secret",
        ],
    ),
    (
        "run-endpoint-with-userinfo",
        [
            "run",
            "finetune-pipeline",
            "--host",
            "http://127.0.0.1:9",
            "--param",
            "model_uri=hf://o/m",
            "--param",
            "data_uri=hf://o/d",
            "--param",
            "export_destination=s3://b/p",
            "--param",
            "s3_endpoint_url=https://key:secret@127.0.0.1:9",
        ],
        2,
        ["--param s3_endpoint_url", "user:password@", "AWS_SECRET_ACCESS_KEY"],
    ),
]


@pytest.mark.parametrize(
    ("argv", "status", "fragments"), [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS]
)
def test_cli_refuses(tmp_path, tiny_llama, tiny_dataset, capsys, monkeypatch, argv, status, fragments):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.xml").write_text("<rows/>")
    (tmp_path / "broken.yaml").write_text("data_uri: [/d\n")
    (tmp_path / "latin1.yaml").write_bytes("data_uri: /données\n".encode("latin-1"))
    argv = [a.format(model=tiny_llama, tmp=tmp_path, data=tiny_dataset["train.jsonl"]) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err
    assert code == status
    assert "Traceback" not in err
    assert_message(RuntimeError(err), fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.yaml",
        "data.xml",
        "latin1.yaml",
    ]  # no run folder
