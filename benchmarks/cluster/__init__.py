"""Benchmarks of adaserve on more than one server: several node servers on one machine, and (later) a cluster."""
