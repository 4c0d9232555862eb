"""adaserve: an inference server for PyTorch models that adapts to every request and to the load."""

__version__ = "0.1.0"
