"""Task ids: 32 random hex digits, never handed out twice, in threads or forked children."""

from __future__ import annotations

import os
import re
import threading

from crawlhub.core.task import new_task_uuid


def test_ids_are_32_hex_digits_and_all_different_across_threads() -> None:
    seen: list[list[str]] = [[] for _ in range(4)]

    def take(out: list[str]) -> None:
        out.extend(new_task_uuid() for _ in range(5_000))

    threads = [threading.Thread(target=take, args=(out,)) for out in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for out in seen for i in out]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids) == 20_000


def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    new_task_uuid()  # the parent holds ids cut from its randomness now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, "".join(new_task_uuid() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode()
    os.close(read)
    parents = {new_task_uuid() for _ in range(10)}
    assert not {child[i:i + 32] for i in range(0, 320, 32)} & parents
