"""``python -m sim run ...``: see :mod:`sim.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
