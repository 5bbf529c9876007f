"""Pipelines (DAGs) built from the components (served as kfp_finetune.pipelines)."""
