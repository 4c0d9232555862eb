"""`python -m adaserve` is the `adaserve` command."""

from adaserve.cli import main

main()
