"""Queue ids a hub process holds in advance, so that the one-step push of tasks whose
uuids it drew itself can be plain commands in one ``MULTI``/``EXEC`` instead of a Lua
script (see ``RedisIntake.intake_push_sent``).

A Redis queue's task id is a number from the queue's ``seq`` counter; the push script
takes them with ``INCRBY``. Here a process takes a block of them ahead (``INCRBY seq
size``, in the same write as a push) and spends it on its next pushes. The ids stay
unique (the counter is never turned back, a block is never handed out twice); ids a
block did not spend are skipped, as ids are after ``purge``. What changes is when an id
was drawn: a block is spent only within :data:`BLOCK_TTL` of its drawing, so tasks two
hub processes push to one queue keep their order of arrival to within that time. One
process spends its blocks in the order it drew them, and when a push by script takes
ids for a queue (past the blocks it holds) it drops those blocks and any block asked
before, so its own tasks keep the order it pushed them in. A process also drops every
block it holds when a connection it pushes on has connected again
(``RedisIntake._check_socket``): a Redis server restarted without the ``INCRBY`` that
drew them would hand them out again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: How long a block of ids may be spent after it was drawn (seconds): the most a task
#: another process pushed later can be leased before one pushed earlier.
BLOCK_TTL = 1.0
#: Block sizes: the first one, and the bound a busy queue's blocks double up to.
MIN_BLOCK, MAX_BLOCK = 64, 4096


@dataclass(slots=True)
class QueueIds:
    """The blocks of ids one process holds for one queue (its ``seq`` key)."""

    #: [next id, end (exclusive), monotonic time drawn], oldest first
    blocks: deque[list[float]] = field(default_factory=deque)
    size: int = MIN_BLOCK
    #: a block is on its way (asked in a write whose answer has not come back)
    asked: bool = False
    #: monotonic time of the last ask (a queue asking again soon gets bigger blocks)
    asked_at: float = -1e9
    #: monotonic time this process last pushed to the queue
    used_at: float = -1e9
    #: bumped by :meth:`drop`: an answer to an ask made before it is not spent
    epoch: int = 0

    def available(self, now: float) -> int:
        """Ids left, once the blocks too old to spend are dropped."""
        blocks = self.blocks
        while blocks and now - blocks[0][2] > BLOCK_TTL:
            blocks.popleft()
        if len(blocks) == 1:  # (the usual case: one block, no generator to sum)
            block = blocks[0]
            return int(block[1] - block[0])
        return int(sum(b[1] - b[0] for b in blocks))

    def take(self, n: int) -> list[int]:
        """``n`` ids, oldest block first (:meth:`available` said there are)."""
        out: list[int] = []
        blocks = self.blocks
        while len(out) < n:
            block = blocks[0]
            start = int(block[0])
            stop = min(int(block[1]), start + n - len(out))
            out += range(start, stop)
            if stop >= block[1]:
                blocks.popleft()
            else:
                block[0] = stop
        return out

    def ask(self, now: float) -> int:
        """The size of the block to ask for now (marks it asked)."""
        if now - self.asked_at < BLOCK_TTL / 4:
            self.size = min(MAX_BLOCK, self.size * 2)
        elif now - self.asked_at > BLOCK_TTL:
            self.size = MIN_BLOCK
        self.asked, self.asked_at = True, now
        return self.size

    def got(self, last: int, size: int, epoch: int) -> None:
        """The answer to an ask made in ``epoch``: ``INCRBY`` gave ``last``, the block's
        last id. The block's age counts from the ask (no later than the drawing)."""
        if epoch == self.epoch:
            self.asked = False
            if last >= size:  # (else not the answer of an INCRBY of size: none is kept)
                self.blocks.append([last - size + 1, last + 1, self.asked_at])

    def lost(self, epoch: int) -> None:
        """An ask made in ``epoch`` whose answer will not come (its write failed)."""
        if epoch == self.epoch:
            self.asked = False

    def drop(self) -> None:
        """Spend no more of the blocks held, nor of those asked (a push by script took
        ids after them)."""
        self.blocks.clear()
        self.asked = False
        self.epoch += 1
