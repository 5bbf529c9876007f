"""kfp-finetune: fine-tune LLMs with torchtune from Kubeflow Pipelines."""

__version__ = "0.1.0"
