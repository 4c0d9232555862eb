"""`python -m adaserve` is the `adaserve` command."""

from adaserve.cli import main

if __name__ == "__main__":  # not when a spawned process (the trace exporter) imports it as its parent's main
    main()
