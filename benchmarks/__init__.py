"""The benchmarks of adaserve: scripts run as modules from the repository root (`python -m benchmarks.NAME`)."""
