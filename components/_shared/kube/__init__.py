"""Kubernetes: the API client with retry and backoff (client.py), list-then-watch (watch.py)."""
