"""Hydra configs of the `mulo-train`, `mulo-decode` and `mulo-eval` entry points, shipped as package data."""
