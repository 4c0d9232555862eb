"""SLO-NNs benchmarks: node activators on Fashion-MNIST MLPs (see benchmarks/slo_nns/run.py)."""
