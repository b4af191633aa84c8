"""The one lease and clock convention: every lease is an absolute expiry in epoch seconds
read from the caller's injected clock; Redis scripts are handed ``now``, never ``TIME``.

The convention
--------------
Every lease crawlhub keeps follows three rules: queue messages (:mod:`crawlhub.queues`),
frontier seeds (:mod:`crawlhub.frontier`), hub ledger claims, deadlines, token buckets
and intake heartbeats (:mod:`crawlhub.hub.state`, :mod:`crawlhub.hub.state.intake`, on
:attr:`crawlhub.hub.hub.Hub.clock`), collection run leases (:mod:`crawlhub.collect.lease`),
agent heartbeats (:mod:`crawlhub.agents.registry`), domain slots and robots.txt fetch
claims (:mod:`crawlhub.agents.politeness`), and the download center's allocations:

1. **Whose clock.** The process that writes or checks a lease reads the time from the
   :data:`Clock` it was given (default :func:`system_clock`, ``time.time``) and stores
   an absolute expiry ``now + lease`` in epoch seconds. A Redis script receives ``now``
   as an argument and never calls ``TIME``; a SQLite transaction receives it as a
   parameter. So a test drives every lease with one fake clock
   (``tests/helpers.FakeClock``) and no test waits for real seconds to pass.
2. **How expiry is claimed.** A lease is expired when ``expiry <= now``. Whoever sees it
   expired claims it atomically - one Lua script or one SQLite transaction that checks
   the expiry and takes it over (or frees it) in the same step - never by reading it,
   deleting it and then handling it, so two claimers cannot both win and a crash between
   steps loses nothing.
3. **Hosts keep their clocks in sync.** Processes on different machines compare each
   other's expiries, so their clocks must agree (run NTP or chrony; a skew of ``s``
   seconds makes a lease look ``s`` seconds longer or shorter to the other host). Keep
   leases long compared with the skew you tolerate (seconds, not milliseconds).

What is not a lease: local waits (the fetch scheduler's pacing, retry backoff) use the
monotonic :class:`crawlhub.fetch.timer.Timer`, which never crosses a process boundary.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Epoch seconds, as ``time.time`` returns them; what every lease is written and read in.
Clock = Callable[[], float]


def system_clock() -> float:
    """The real wall clock in epoch seconds (``time.time``); the default :data:`Clock`."""
    return time.time()
