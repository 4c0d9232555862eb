"""Tests of the DAG query planner (GATI §5)."""
