"""A job for the SDK tests, run as a real process: counts a tick every 10 ms while
running, holds still while paused (saying once when it noticed), ends cleanly when exit
is asked, with its final counters flushed."""

from __future__ import annotations

import time

from crawlhub import sdk


def main() -> None:
    control = sdk.control()
    ticks = 0
    with sdk.task("count"):
        while True:
            if control.paused:
                sdk.log(f"paused at {time.time():.6f} after {ticks} ticks")
            if not control.wait_while_paused():
                break
            ticks += 1
            sdk.count("ticks")
            time.sleep(0.01)
    sdk.log(f"exit after {ticks} ticks")
    sdk.flush()


if __name__ == "__main__":
    main()
