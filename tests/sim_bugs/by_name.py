"""``main`` is the buggy program of the class named by ``$SIM_BUG`` (for CLI runs of any class in tests/sim_bugs)."""

from __future__ import annotations

import os
from typing import Any

from sim_bugs import BLIND, CATALOG, VARIANTS

_CLASS = {bc.name: bc for bc in CATALOG + VARIANTS + BLIND}[os.environ["SIM_BUG"]]


async def main() -> Any:
    return await _CLASS.buggy()
