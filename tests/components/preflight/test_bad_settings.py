"""Pre-flight refuses every bad setting of issue 23's list in seconds, with one `error:` line naming the pipeline
parameter and the fix, and before any weights move: the model comes from the hub stand-in, whose request log
shows config.json and the tokenizer files fetched where the run had to be resolved, and never a weights file.

The cases run as the fine-tune pipeline would run them on a cluster (backend trainjob, with its runtime present on
the Kubernetes stand-in), in one child process (the hub client reads HF_ENDPOINT once, at import)."""

import json
import shutil

import pytest

from tests.support.hub_standin import HubStandin
from tests.support.kube_standin import KubeStandin
from tests.support.sources import hub_env, result, run_python

# A valid CPU run on a cluster: each case changes what it names.
VALID = {"tune_device": "cpu", "tune_gpus_per_node": 0}
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
TYPO_SCHEDULER = "torchtune.training.lr_schedulers.get_cosine_schedul_with_warmup"

# case -> (settings over VALID, model repo, the parameter named, what the message says)
CASES = {
    "method typo": ({"tune_method": "lorra"}, "org/tiny", "tune_method", "did you mean 'lora'"),
    "no epochs": ({"tune_epochs": 0}, "org/tiny", "tune_epochs", "must be at least 1 (got 0)"),
    "learning rate 0": ({"tune_learning_rate": 0.0}, "org/tiny", "tune_learning_rate", "must be > 0 (got 0.0)"),
    "learning rate inf": (
        {"tune_learning_rate": float("inf")}, "org/tiny", "tune_learning_rate", "must be a finite number",
    ),
    "optimizer typo": (
        {"tune_optimizer": "torch.optim.AdamWW"}, "org/tiny", "tune_optimizer", "did you mean torch.optim.AdamW?",
    ),
    "scheduler typo": (
        {"tune_lr_scheduler": TYPO_SCHEDULER}, "org/tiny", "tune_lr_scheduler",
        "did you mean torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup?",
    ),
    "override typo": (
        {"tune_overrides": {"optimizer._component_": "torch.optim.SGDD"}}, "org/tiny", "tune_overrides",
        "did you mean torch.optim.SGD?",
    ),
    "cuda without GPUs": (
        {"tune_device": "cuda", "tune_gpus_per_node": 0}, "org/tiny", "tune_device", "set tune_gpus_per_node",
    ),
    "malformed image": (
        {"tune_trainer_image": "Registry.io/Trainer image"}, "org/tiny", "tune_trainer_image",
        "is not an image reference",
    ),
    "unsupported family": ({}, "org/made-up", "model_uri", "no causal-LM class for model_type 'made_up_lm'"),
    "torchtune setting on the transformers engine": (
        {"tune_compile": "true", "tune_backend": "local"}, "org/qwen3-moe", "tune_compile", "is a torchtune setting the transformers engine",
    ),
    "lm-eval tasks on a classifier": (
        {"eval_lm_eval_tasks": ["arc_easy"], "data_type": "classification", "tune_backend": "local"}, "org/tiny",
        "eval_lm_eval_tasks", "lm-eval's tasks score language models, and this fine-tune trains a sequence classifier",
    ),
    "transformers setting on the torchtune engine": (
        {"tune_lora_target_parameters": EXPERTS}, "org/tiny", "tune_lora_target_parameters",
        "is not read by torchtune (its LoRA adapts linear layers only",
    ),
    "max_seq_len beyond the model's positions": (
        {"tune_max_seq_len": 10_000_000, "tune_backend": "local"}, "org/qwen3-moe", "tune_max_seq_len",
        "more than the",
    ),
    "dropout on adapted experts": (
        {"tune_lora_target_parameters": EXPERTS, "tune_lora_dropout": 0.1, "tune_backend": "local"},
        "org/qwen3-moe", "tune_lora_dropout", "must be 0 where LoRA adapts 3D parameters",
    ),
    # tune_runtime auto: the chosen engine's runtime, which this cluster lacks (it has torchtune's only).
    "the engine's runtime not installed": (
        {}, "org/qwen3-moe", "tune_runtime", "ClusterTrainingRuntime 'transformers' not found: install",
    ),
    "incomplete config.json": ({}, "org/no-dims", "model_uri", "config.json has no 'hidden_size'"),
    "unproven layout": (
        {}, "org/untied", "model_uri",
        "config.json has tie_word_embeddings = false (carried: false), which no parity case of the llama3_2 family",
    ),
    "eval device without GPU": (
        {"eval_device": "cuda"}, "org/tiny", "eval_device", "set eval_gpus=1",
    ),
    "model too big to evaluate on one GPU": (
        {"tune_device": "cuda", "tune_gpus_per_node": 8}, "org/huge", "eval_gpus",
        "evaluate loads the whole model on one GPU: hf://org/huge has 68.5B parameters, 128 GiB in bf16",
    ),
    "export format typo": ({"export_format": "merge"}, "org/tiny", "export_format", "must be one of merged"),
    "backend typo": ({"tune_backend": "trainjobs"}, "org/tiny", "tune_backend", "did you mean 'trainjob'?"),
    "cleanup typo": ({"tune_cleanup_policy": "on_success"}, "org/tiny", "tune_cleanup_policy", "did you mean"),
}  # fmt: skip

SCENARIOS = """
import json, sys, time
from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

def attempt(arguments):
    started = time.monotonic()
    try:
        outcome = {"done": run_preflight(**arguments)}
    except PreflightError as error:
        outcome = {"error": str(error)}
    return {**outcome, "seconds": time.monotonic() - started}

outcomes = {case: attempt(arguments) for case, arguments in json.loads(sys.argv[1]).items()}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchtune", "torchao", "bitsandbytes"))
print(json.dumps({**outcomes, "heavy modules": heavy}))
"""


def _arguments(repo: str, settings: dict) -> dict:
    """run_preflight's arguments: tune_backend is its own, the other settings go in `settings`."""
    settings = {**VALID, **settings}
    return {
        "model_uri": f"hf://{repo}",
        "tune_backend": settings.pop("tune_backend", "trainjob"),
        "settings": settings,
    }


@pytest.fixture(scope="module")
def outcomes(tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preflight")
    moe = shutil.copytree(tiny_llama, tmp / "qwen3-moe")
    config = json.loads((moe / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_moe"}))
    made_up = shutil.copytree(tiny_llama, tmp / "made-up")
    (made_up / "config.json").write_text(json.dumps({**config, "model_type": "made_up_lm"}))
    no_dims = shutil.copytree(tiny_llama, tmp / "no-dims")
    (no_dims / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
    untied = shutil.copytree(tiny_llama, tmp / "untied")  # Llama 3.2's layers without its tied embeddings
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    # Llama-3.1-70B's layer dims (meta-llama/Llama-3.1-70B config.json) on the tiny model's vocabulary and tied
    # embeddings: ~68B parameters, which no single 80 GiB GPU holds for evaluation.
    huge = shutil.copytree(tiny_llama, tmp / "huge")
    dims = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "intermediate_size": 28672, "head_dim": 128}  # fmt: skip
    (huge / "config.json").write_text(json.dumps({**config, **dims}))
    scenarios = {case: _arguments(repo, settings) for case, (settings, repo, _, _) in CASES.items()}
    # The same model fits one GPU for evaluation where each GPU has 141 GiB (an H200).
    scenarios["huge model, H200"] = _arguments(
        "org/huge", {"tune_device": "cuda", "tune_gpus_per_node": 8, "tune_gpu_memory_gib": 141.0}
    )
    scenarios["valid"] = _arguments("org/tiny", {})
    scenarios["experts adapted"] = _arguments(
        "org/qwen3-moe", {"tune_lora_target_parameters": EXPERTS, "tune_backend": "local"}
    )
    scenarios["lm-eval tasks on the transformers engine"] = _arguments(
        "org/qwen3-moe", {"eval_lm_eval_tasks": ["arc_easy"], "tune_backend": "local"}
    )
    scenarios["two problems"] = _arguments("org/made-up", {"tune_method": "lorra"})
    with HubStandin() as hub, KubeStandin(namespace="team-a") as kube:
        kube.add_runtime("torchtune")
        hub.add_repo("org/tiny", tiny_llama)
        hub.add_repo("org/qwen3-moe", moe)
        hub.add_repo("org/made-up", made_up)
        hub.add_repo("org/no-dims", no_dims)
        hub.add_repo("org/untied", untied)
        hub.add_repo("org/huge", huge)
        env = {**hub_env(hub.endpoint, tmp), "KUBECONFIG": str(kube.kubeconfig_path)}
        outcomes = result(run_python(SCENARIOS, env, json.dumps(scenarios)))
        files = [f.relative_to(tiny_llama).as_posix() for f in tiny_llama.rglob("*") if f.is_file()]
        outcomes["gets"] = {name: hub.gets_of(name) for name in files}
        yield outcomes


@pytest.mark.slow
def test_a_valid_run_passes_with_the_model_resolved_from_its_config_and_tokenizer(outcomes):
    assert outcomes["valid"]["done"] == ["model_uri", "model", "tune_runtime"], outcomes["valid"]


@pytest.mark.slow
def test_lora_on_the_experts_passes_where_the_transformers_engine_trains(outcomes):
    assert "error" not in outcomes["experts adapted"], outcomes["experts adapted"]


@pytest.mark.slow
def test_lm_eval_tasks_pass_on_the_transformers_engine_whose_image_has_its_lm_eval(outcomes):
    outcome = outcomes["lm-eval tasks on the transformers engine"]
    assert "error" not in outcome, outcome


@pytest.mark.slow
def test_a_model_that_fits_one_gpu_of_the_cluster_passes_the_evaluation_size_check(outcomes):
    assert outcomes["huge model, H200"].get("done") == ["model_uri", "model", "tune_runtime"], outcomes[
        "huge model, H200"
    ]


@pytest.mark.slow
def test_preflight_imports_no_torch(outcomes):
    """It runs on the component image, which has torchtune's files and no torch."""
    assert outcomes["heavy modules"] == []


def test_a_bad_setting_and_a_bad_model_are_listed_together(outcomes):
    message = outcomes["two problems"]["error"]
    assert message.startswith("pre-flight found 2 problems"), message
    assert "(1) tune_method: " in message and "| (2) model_uri: " in message, message


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_setting_fails_in_seconds_with_one_line_naming_the_parameter(outcomes, case):
    _, _, parameter, says = CASES[case]
    outcome = outcomes[case]
    assert "error" in outcome, f"{case} passed pre-flight: {outcome}"
    message = outcome["error"]
    assert "\n" not in message, "one line"
    assert message.startswith("pre-flight found 1 problem, no weights were downloaded"), message
    assert f"(1) {parameter}: " in message and says in message, message
    assert outcome["seconds"] < 30, f"took {outcome['seconds']:.0f} s"


def test_no_weights_file_was_requested_only_config_and_tokenizer_files(outcomes):
    """The model was resolved (config.json and the tokenizer fetched) where the settings allowed it, and no
    weights file was ever requested."""
    gets = outcomes["gets"]
    assert "model.safetensors" in gets, gets
    assert gets["config.json"] > 0 and gets["original/tokenizer.model"] > 0, gets
    assert {name: n for name, n in gets.items() if name.endswith(".safetensors") and n} == {}, gets
