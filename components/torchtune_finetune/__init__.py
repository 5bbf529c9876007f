"""torchtune-finetune: resolve a torchtune run and execute it locally or as a Kubeflow Trainer TrainJob."""
