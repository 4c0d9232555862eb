"""The suite's processes (pytest-xdist's workers and the benchmarks and servers they start, which inherit the
environment) let OpenMP's idle threads sleep instead of spinning: torch's default spin-wait keeps a second thread
busy after every parallel operation, which on the 2-core VM took the other worker's core (an MLP epoch of 10,000
rows: 4–8 CPU-s and 11–14 s beside other work, 0.3–0.4 CPU-s and 0.7 s passive). Set here, before anything imports
torch (OpenMP reads it once, when loaded); the servers' model processes run passive already."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
