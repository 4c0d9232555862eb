"""Packrat's benchmarks: speedup over the fat instance (in-process and end to end) and the reconfiguration timeline."""
