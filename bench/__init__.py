"""Reproducible benchmarks (see bench/README.md); each file runs with ``python bench/<name>.py``."""
