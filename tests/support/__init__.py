"""Local stand-ins that speak real protocols on 127.0.0.1, and helpers for tests."""
