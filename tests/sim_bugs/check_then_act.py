"""Check-then-act leader election: 'if nobody is leader yet, I am' through the store."""

from __future__ import annotations

import aiodist


async def _run(atomic: bool) -> int:
    pg = await aiodist.init_process_group()
    store = pg.store
    me = str(pg.rank)
    if atomic:
        leader = (await store.compare_set("leader", "", me)).decode()
    elif not await store.check(["leader"]):
        await store.set("leader", me)  # nobody was leader when I looked: maybe somebody is by now
        leader = me
    else:
        leader = (await store.get("leader")).decode()
    if leader == me:
        await store.add("leaders", 1)
    await aiodist.barrier()
    leaders = int(await store.add("leaders", 0))
    await aiodist.destroy_process_group()
    if leaders != 1:
        raise AssertionError(f"{leaders} ranks believe they lead")
    return int(leader)


async def buggy() -> int:
    return await _run(atomic=False)


async def fixed() -> int:
    return await _run(atomic=True)
