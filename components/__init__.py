"""KFP components, one folder each (served as kfp_finetune.components)."""
