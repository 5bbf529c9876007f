"""export: deliver a fine-tuned model (merged and/or adapter) to s3://, hf:// or a path, with a model card."""
