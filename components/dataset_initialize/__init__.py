"""dataset-initialize: bring a fine-tuning dataset into the run workspace."""
