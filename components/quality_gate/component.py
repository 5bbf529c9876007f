"""The quality-gate KFP component: surfaces evaluate's decision as this task's single output."""

from kfp import dsl

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def quality_gate(passed: bool, gate_metric: str = "") -> bool:
    """Decide whether the tuned model is published: returns evaluate's `passed`.

    A pipeline branches on this task's output with `dsl.If(gate.output == True)`. It exists because a
    condition on a sub-pipeline's or a named output is not resolved by every runner (kfp.local resolves only a
    task's single output), and because the decision deserves its own node in the run graph.

    Args:
        passed: evaluate's `passed` output (the tuned model met the gate).
        gate_metric: The metric the gate compared, for the log.

    Returns:
        True when the model should be exported.
    """
    verdict = "passed" if passed else "failed: the model is not exported"
    print(f"quality gate on {gate_metric or 'the evaluate step'}: {verdict}", flush=True)
    return passed
