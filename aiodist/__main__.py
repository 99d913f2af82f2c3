"""``python -m aiodist ...`` is the ``aiodist`` command."""

import sys

from .cli import main

sys.exit(main())
