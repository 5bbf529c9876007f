"""Image references: well-formed by the grammar the kubelet parses them with, checked where they are set (the
compile-time environment) and where a user passes one (pre-flight's tune_trainer_image)."""

import os
import subprocess
import sys

import pytest

from kfp_finetune.components._shared.images import reference_problem


@pytest.mark.parametrize(
    "reference",
    ["ubuntu", "ghcr.io/org/trainer:1.0", "localhost:5000/a/b_c-d.e", "reg.io/x@sha256:" + "a" * 64,
     "reg.io/x:v1.2@sha256:" + "0" * 64, "[::1]:5000/x:latest"],
)  # fmt: skip
def test_well_formed_references_pass(reference):
    assert reference_problem(reference) is None


@pytest.mark.parametrize(
    ("reference", "says"),
    [("Ghcr.io/Org/Trainer:1", "lower case"), ("trainer image:1", "not an image reference"),
     ("ghcr.io/org/x:", "not an image reference"), ("ghcr.io//x", "not an image reference"),
     ("ghcr.io/org/x:1.0:2", "not an image reference"), ("x@sha256:abc", "not an image reference")],
)  # fmt: skip
def test_malformed_references_are_named_with_the_form_to_write(reference, says):
    problem = reference_problem(reference)
    assert problem and says in problem and "[registry[:port]/]repository[:tag]" in problem


def test_a_malformed_image_in_the_compile_environment_fails_at_once_naming_the_variable():
    env = {**os.environ, "KFP_FINETUNE_TRAINER_IMAGE": "registry.io/Trainer:1"}
    compiled = subprocess.run(
        [sys.executable, "-c", "import kfp_finetune.components._shared.images"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert compiled.returncode != 0
    assert "KFP_FINETUNE_TRAINER_IMAGE: 'registry.io/Trainer:1' is not an image reference" in compiled.stderr
