"""model-initialize: bring a base model into the run workspace."""
