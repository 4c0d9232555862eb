"""GATI's DAG queries (§5): one request answered by several models in turn, within its latency SLO."""
