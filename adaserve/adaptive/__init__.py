"""Per-request adaptive computation inside a worker's forward pass; each technique is a self-contained package.

`activator/`: SLO-NNs node activators (per-request dynamic dropout of MLP nodes for an accuracy or a latency
target). `gati/`: GATI learned caches (per-request early exit at hidden layers).
"""
