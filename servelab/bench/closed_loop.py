"""When the load client sends each request: open loop, sessions, or closed-loop users.

A request that is not part of a session is sent at its trace time. A session's first turn is
sent at its trace time too, and turn k only once turn k-1's answer has finished and its
think time passed (its prompt then carries the conversation, see servelab.bench.prompts).
With `users`, N users run the sessions (single requests being sessions of one turn) one
after another in trace order, each starting its next as soon as its last one finished:
a closed loop whose load is set by the server's speed, not by the trace's clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from servelab.bench.prompts import Conversation
from workloads.sessions import Chain

# Sends request `row` of the run (carrying `conversation`, None outside sessions); returns
# once its answer has ended, however it ended.
SendRow = Callable[[int, Conversation | None], Awaitable[None]]


async def drive(chains: list[Chain], think_s: Sequence[float], send: SendRow, t0: float,
                users: int | None = None) -> None:
    """Send every chain: each at its start time (users None), or through `users` closed-loop
    users; a turn after the first waits for the previous answer plus its think time."""
    if users is None:
        await asyncio.gather(*(_open_chain(chain, think_s, send, t0) for chain in chains))
        return
    if users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    queue: asyncio.Queue[Chain] = asyncio.Queue()
    for chain in chains:
        queue.put_nowait(chain)
    await asyncio.gather(*(_user(queue, think_s, send) for _ in range(min(users, len(chains)))))


async def _open_chain(chain: Chain, think_s: Sequence[float], send: SendRow,
                      t0: float) -> None:
    delay_s = t0 + chain.start_s - time.perf_counter()
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    await _run_chain(chain, think_s, send)


async def _user(queue: asyncio.Queue[Chain], think_s: Sequence[float], send: SendRow) -> None:
    """One closed-loop user: the next chain as soon as the last one ended."""
    while not queue.empty():
        await _run_chain(queue.get_nowait(), think_s, send)


async def _run_chain(chain: Chain, think_s: Sequence[float], send: SendRow) -> None:
    conversation = Conversation() if chain.session_id is not None else None
    for k, row in enumerate(chain.rows):
        if k > 0 and think_s[row] > 0:
            await asyncio.sleep(think_s[row])
        await send(row, conversation)
