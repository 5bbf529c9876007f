"""Test suite. `tests.support` holds the local stand-ins (Kubernetes API, HF hub) and shared fixtures."""
