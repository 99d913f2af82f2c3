"""The lease program without fencing, as a file the CLI runs (``python -m sim run -n 3 lease_buggy_main.py``)."""

from lease import buggy as main  # noqa: F401
