"""Container images the components and TrainJobs use — the one place they are set, and the one check of an image
reference's form.

Fixed at compile time: set KFP_FINETUNE_COMPONENT_IMAGE / KFP_FINETUNE_TRAINER_IMAGE /
KFP_FINETUNE_TRANSFORMERS_TRAINER_IMAGE before compiling to use
your own registry (a malformed reference fails the import, so compiling, at once). Standard library only:
component.py files import this at module level.
"""

import os
import re

from kfp_finetune import __version__

# The reference grammar of the distribution project (distribution/reference/regexp.go), which containerd and
# the kubelet parse image names with: [host[:port]/]path[:tag][@digest], path components in lower case.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?")


def reference_problem(reference: str) -> str | None:
    """None for a well-formed image reference, else why it is not one (for the message naming its setting)."""
    if not _REFERENCE.fullmatch(reference):
        hint = "; repository names are lower case" if reference != reference.lower() else ""
        return (
            f"{reference!r} is not an image reference: write [registry[:port]/]repository[:tag][@sha256:digest], "
            f"e.g. ghcr.io/org/trainer:1.0{hint}"
        )
    return None


def _from_environment(variable: str, default: str) -> str:
    reference = os.environ.get(variable, default)
    problem = reference_problem(reference)
    if problem:
        raise ValueError(f"{variable}: {problem}")
    return reference


COMPONENT_IMAGE = _from_environment(
    "KFP_FINETUNE_COMPONENT_IMAGE", f"ghcr.io/kfp-finetune/kfp-finetune-component:{__version__}"
)
TRAINER_IMAGE = _from_environment(
    "KFP_FINETUNE_TRAINER_IMAGE", f"ghcr.io/kfp-finetune/kfp-finetune-trainer:{__version__}"
)
# The transformers engine's trainer: the same Dockerfile with the engine's extra (transformers 5, TRL, PEFT) instead
# of lm-eval's transformers 4 (images/README.md); the image of runtimes/transformers*.yaml.
TRANSFORMERS_TRAINER_IMAGE = _from_environment(
    "KFP_FINETUNE_TRANSFORMERS_TRAINER_IMAGE",
    f"ghcr.io/kfp-finetune/kfp-finetune-trainer-transformers:{__version__}",
)
