"""The DAG query planner benchmark: per-node model options of different accuracy and cost, planned under a budget."""
