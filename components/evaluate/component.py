"""The evaluate KFP component (signature + docstring; the implementation is evaluate.py)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output

from kfp_finetune.components._shared.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate(
    workspace_path: str,
    model: Input[Model],
    eval_data: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[HTML],
    samples: Output[Dataset],
    base_model: Input[Model] = None,
    max_samples: int = 200,
    batch_size: int = -1,
    max_new_tokens: int = 64,
    max_seq_len: int = 0,
    seed: int = 0,
    device: str = "auto",
    gate_metric: str = "eval_loss",
    min_improvement: float = 0.0,
    confidence: float = 0.95,
    thresholds: dict = {},  # noqa: B006 (KFP needs a literal default)
    lm_eval_tasks: list = [],  # noqa: B006
    lm_eval_limit: int = 0,
    lm_eval_include_path: str = "",
    report_samples: int = 20,
    run_id: str = "",
    task_name: str = "evaluate",
    task_id: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "kfp-finetune",
) -> NamedTuple("Outputs", [("passed", bool)]):
    """Tell whether fine-tuning helped: the tuned model against its base on held-out data, with a quality gate.

    Loads both models the way the engine that trained them does (torchtune: its component builder and HF
    checkpointer; transformers: its Auto classes, the adapter through PEFT; for a LoRA or DoRA adapter, the base is
    the same model with its adapter disabled, loaded once) and builds the eval examples as that run's training
    did (torchtune's dataset builder, or TRL's formatting and masking) with its tokenizer, so the loss is
    computed on exactly the tokens training learned (the response; the prompt is masked). For every sample it
    measures teacher-forced loss, then generates greedily (deterministic) from the training prompt format and
    scores the answer against the reference: exact match, token F1 and ROUGE-L. A sequence classifier (trained on
    classification data) is scored by its eval_loss on each row's class, accuracy and macro-F1 instead. Optionally runs lm-eval-harness
    tasks on the tuned and base models (torchtune's eleuther_eval recipe, or lm-eval's Hugging Face model for the
    transformers engine; needs lm-eval in the image, as the trainer images have). Base and tuned are
    scored on the same examples, so each metric's improvement gets a paired bootstrap confidence interval (2,000
    seeded resamples of the examples; lm-eval metrics: a normal approximation from lm-eval's standard errors).
    The quality gate passes when the tuned model beats the base on `gate_metric` by more than the eval set's
    noise (the improvement and the lower bound of its interval are above 0), by at least `min_improvement`, and
    meets every threshold; a NaN never passes. Without a base model only the thresholds decide. Wire `passed`
    into `dsl.If` to export only better models. Runs on a GPU the task requests (the pipelines give it one when
    the fine-tune used GPUs), else on CPU, and on the image of the engine that trained the model (the fine-tune's
    `model_image`). Writes samples, report and metrics to
    `<workspace>/eval/<task_name>-<task>/` too (`<task>`: 8 characters of a hash of `task_id`).

    Args:
        workspace_path: The run workspace; pass `dsl.WORKSPACE_PATH_PLACEHOLDER`.
        model: The tuned model: torchtune-finetune's `model` output (its merged weights are evaluated), or any
            model-initialize output.
        eval_data: Held-out split from dataset-initialize (its `eval` output).
        base_model: The base model to compare with (model-initialize's output); when not connected, the base
            the fine-tune recorded is used if it is in the workspace, else the tuned model is reported alone.
        max_samples: Eval rows used, a seeded random subset; 0: all rows.
        batch_size: Sequences per forward pass, for both loss and generation; -1: 8 on CPU, on a GPU as many
            as half its memory beside the weights holds (8 to 64).
        max_new_tokens: Generation stops after this many tokens (or at the tokenizer's stop tokens).
        max_seq_len: Truncate examples to this many tokens; 0: the training run's max_seq_len (else no limit).
        seed: Chooses the subset and seeds torch; the same seed gives the same results.
        device: auto (cuda when this step has a GPU, in the dtype training used, bf16 by default; else cpu in
            fp32), cpu or cuda.
        gate_metric: The metric the tuned model must improve: eval_loss, perplexity, exact_match, token_f1,
            rouge_l, accuracy or macro_f1 (classifiers), or an lm-eval metric `lm_eval_<task>_<metric>` (e.g.
            lm_eval_arc_easy_acc).
        min_improvement: Required gain of tuned over base on gate_metric, in its units (a loss decrease for
            eval_loss, absolute points for exact_match: 0.05 = 5 points), on top of the gain beyond the noise
            the gate always requires; 0: no more than that. Needs a base model.
        confidence: Confidence level of the improvement's interval, between 0 and 1 (0.95: a 95% interval);
            higher asks for stronger evidence before the gate passes.
        thresholds: Absolute bounds the tuned model must meet, e.g. {"exact_match": 0.5, "eval_loss": 1.2}:
            minimums, or maximums for loss and perplexity metrics.
        lm_eval_tasks: lm-eval-harness task names (e.g. ["arc_easy"]); empty: none. An adapter-only fine-tune is
            merged into its base first (on CPU, once per run). Needs Hub access from the step (task data, and the
            gpt2 torchtune's eleuther_eval loads first), or a local include path (plus, for torchtune's models, gpt2
            in the image's Hugging Face cache). Not for classifiers or vision-language models (pre-flight refuses).
        lm_eval_limit: Examples per lm-eval task; 0: all.
        lm_eval_include_path: A folder of custom lm-eval task YAMLs (e.g. on a mounted volume); empty: none.
        report_samples: Number of samples shown in the report (all are in `samples`).
        run_id: The KFP run id; pass `dsl.PIPELINE_JOB_ID_PLACEHOLDER` (names the eval folder without task_id).
        task_name: Readable part of the eval folder's name.
        task_id: KFP's id of this task; pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (gives each evaluation in a run its
            own eval folder); empty: not under KFP.
        mlflow_tracking_uri: MLflow tracking server (http:// or https://, no credentials in it) this step also
            logs to; empty: none, unless KFP made an MLflow run for the task (MLFLOW_TRACKING_URI and MLFLOW_RUN_ID
            in the environment), which is used instead. Credentials: MLFLOW_TRACKING_TOKEN or
            MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from a Secret.
        mlflow_experiment: The MLflow experiment the run is created in (with mlflow_tracking_uri).

    Returns:
        metrics: tuned_<m>, base_<m>, delta_<m> (tuned - base) and the improvement's interval
            <m>_improvement_ci_low / _high for m in eval_loss, perplexity, exact_match, token_f1, rouge_l (and
            lm_eval_* metrics), plus confidence, num_samples, response_tokens, passed (1/0), gate_improvement
            and wall_seconds.
        report: Quality-gate verdict and why, base vs tuned table with deltas and intervals, the training loss
            curve when the model artifact carries one, and sample prompts with reference, base and tuned outputs.
        samples: JSON Lines, one per evaluated row: row, prompt, reference, tuned / base generation, per-row
            loss and exact match.
        passed: True when the quality gate passes; use with `dsl.If(task.outputs["passed"] == True)`.
    """
    parameters = dict(locals())  # taken first: exactly this component's parameters
    from collections import namedtuple

    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.evaluate.evaluate import ConfigError, run_component

    outputs = namedtuple("Outputs", ["passed"])
    with usage_errors(ConfigError):
        return outputs(run_component(**parameters))
