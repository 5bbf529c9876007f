"""register-model: record an exported model, with its lineage, in the Kubeflow Model Registry."""
