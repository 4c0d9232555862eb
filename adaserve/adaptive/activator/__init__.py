"""SLO-NNs node activators: per request, compute only the top-k% nodes of the hidden layers of an MLP or of a
model's MLP head, with k chosen for an accuracy target (ACLO) or a latency target under interference (LCAO).

Modules, one concern each: `layers` (a loaded model as a prefix and a Linear + ReLU head), `lsh` (FreeHash and
the Node Importance tables), `confidence` (KL confidence tables and calibration), `latency` (T(k, β) and the live
interference probe), `kernel` (the compiled sparse and dense forward), `select` (ACLO and LCAO), `artifact`
(versioned storage in the model's directory), `build` and `cli` (`adaserve activator build`), `runtime` (the
strategy a worker delegates targeted rows to). Nothing is imported here, so the server's engine can import
`select` without loading numba.
"""
