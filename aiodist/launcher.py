"""``aiodist run`` and ``aiodist.spawn``: the entry points of the launcher.

    aiodist run -n 4 prog.py [args...]                    # like torchrun --nproc-per-node 4
    aiodist run --nnodes 2 --node-rank 0 --master-addr HOST --master-port P -n 4 prog.py
    aiodist run -n 4 -m package.module [args...]
    python -m aiodist.launcher run -n 4 prog.py           # the same without the `aiodist` command

How a program is started (:mod:`aiodist.launch.program` has the details):

* a file with an ``if __name__ == "__main__":`` guard runs as a script,
  ``python prog.py args`` — the guard decides what happens;
* a file *without* that guard that defines a top-level ``main`` (typically
  ``async def main()``) and does not call it itself is imported by
  ``python -m aiodist.launch_bootstrap prog.py args``, which then runs
  ``main()`` (on a fresh event loop, uvloop when installed) — the same
  contract as ``python -m sim run -n 8 prog.py``, which imports the module and
  calls ``main()`` in each virtual rank;
* anything else runs as a script, unchanged.

So write a program as a module with ``async def main()``; an
``if __name__ == "__main__": asyncio.run(main())`` guard is optional and gives
the same result under both runners. ``main``'s return value is ignored by the
launcher (exit status 0 unless it raises or calls ``sys.exit``).

The implementation lives in the :mod:`aiodist.launch` package.
"""

from __future__ import annotations

import sys

from .launch import LaunchConfig, LaunchResult, RankExit, add_cli, launch, main, spawn

__all__ = ["LaunchConfig", "LaunchResult", "RankExit", "add_cli", "launch", "main", "spawn"]

if __name__ == "__main__":
    sys.exit(main())
