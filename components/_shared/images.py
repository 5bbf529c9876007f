"""Container images the components and TrainJobs use — the one place they are set.

Fixed at compile time: set KFP_FINETUNE_COMPONENT_IMAGE / KFP_FINETUNE_TRAINER_IMAGE before compiling to use
your own registry. Standard library only: component.py files import this at module level.
"""

import os

from kfp_finetune import __version__

COMPONENT_IMAGE = os.environ.get(
    "KFP_FINETUNE_COMPONENT_IMAGE", f"ghcr.io/kfp-finetune/kfp-finetune-component:{__version__}"
)
TRAINER_IMAGE = os.environ.get(
    "KFP_FINETUNE_TRAINER_IMAGE", f"ghcr.io/kfp-finetune/kfp-finetune-trainer:{__version__}"
)
