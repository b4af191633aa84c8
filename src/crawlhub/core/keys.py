"""Every Redis key crawlhub writes, in one place.

All keys start with a configurable prefix (default ``crawlhub:``) so several
deployments, or tests, can share one Redis server without touching each other.
"""

from __future__ import annotations

DEFAULT_PREFIX = "crawlhub:"


def queue_keys(prefix: str, name: str) -> dict[str, str]:
    """Keys of one reliable queue (hash-tagged so a cluster keeps them on one slot)."""
    base = f"{prefix}q:{{{name}}}"
    return {
        "ready": f"{base}:ready",
        "leased": f"{base}:leased",
        "dead": f"{base}:dead",
        "payloads": f"{base}:payloads",
        "priorities": f"{base}:priorities",
        "attempts": f"{base}:attempts",
        "stats": f"{base}:stats",
        "seq": f"{base}:seq",
        "reasons": f"{base}:reasons",
    }


def queue_registry(prefix: str) -> str:
    return f"{prefix}queues"


def hub_keys(prefix: str) -> dict[str, str]:
    """Keys of the hub's shared state: task ledger, deadlines, leases (uuid -> lease end)
    and what each lease is for, counters, token buckets, and the stem of the per-second
    dispatch counts (``rate:<epoch second>``, outbound -> n)."""
    return {
        "ledger": f"{prefix}hub:ledger",
        "deadlines": f"{prefix}hub:deadlines",
        "counters": f"{prefix}hub:counters",
        "retention": f"{prefix}hub:retention",
        "tokens": f"{prefix}hub:tokens",
        "leases": f"{prefix}hub:leases",
        "pending": f"{prefix}hub:pending",
        "rate": f"{prefix}hub:rate:",
        # intake (hub/state/intake/): uuid -> when its push began, for tasks recorded and
        # not yet known pushed, and the hub process pushing it; hub process -> its last
        # heartbeat; frontier gate (frontier, segment, key) -> uuid holding it
        "unpushed": f"{prefix}hub:unpushed",
        "owners": f"{prefix}hub:owners",
        "alive": f"{prefix}hub:alive",
        "gates": f"{prefix}hub:gates",
    }


def agent_keys(prefix: str) -> dict[str, str]:
    """Keys of the agent registry and the domain gate (hash-tagged ``{agents}``: one slot,
    so one Lua script may touch them all). ``info`` (agent id -> registration JSON),
    ``beat`` (agent id -> last heartbeat JSON), ``seen`` (sorted set: agent id -> last
    sign of life, epoch seconds); ``domain`` is the stem of the gate's per-domain keys
    (``<domain>:slots`` sorted set slot id -> lease expiry, ``<domain>:pace`` hash of
    next start / backoff end) and ``robots`` the stem of the robots.txt cache
    (``<origin>`` hash of body, status, expiry, fetch claim); ``adaptive`` a sorted set
    of domain -> time of its last adaptive answer (their figures in ``<domain>:adapt``
    hashes)."""
    base = f"{prefix}ag:{{agents}}"
    return {
        "info": f"{base}:info",
        "beat": f"{base}:beat",
        "seen": f"{base}:seen",
        "domain": f"{base}:d:",
        "robots": f"{base}:r:",
        "adaptive": f"{base}:adaptive",
    }


def sink_stream_index(prefix: str, stream: str) -> str:
    """The hash of record key -> content hash a Redis stream sink has written.

    The stream key is the user's name verbatim (consumers read it); the index carries the
    stream's hash slot (its ``{tag}``, else the whole name) so one Lua script can touch both
    in a Redis Cluster.
    """
    start = stream.find("{")
    end = stream.find("}", start + 1) if start >= 0 else -1
    tag = stream[start + 1 : end] if start >= 0 and end > start + 1 else stream
    return f"{prefix}sink:{{{tag}}}:index:{stream}"


def frontier_keys(prefix: str, name: str) -> dict[str, str]:
    """Keys of one frontier (hash-tagged by name: one slot, so Lua may touch them all).

    ``segment`` is the stem of the per-segment keys the Lua scripts build by appending
    ``<segment>:seeds`` (hash key -> seq|priority|seed JSON), ``<segment>:attempts``,
    ``<segment>:stats`` (counters), ``<segment>:bloom`` (layer sizes and counts) and
    ``<segment>:bloom:<i>`` (bit array of bloom layer i, set with BITFIELD);
    ``validators`` (hash key -> the last answer's ETag / Last-Modified / body hash, kept
    across segments for conditional recrawls).
    """
    base = f"{prefix}fr:{{{name}}}"
    return {
        "ready": f"{base}:ready",
        "due": f"{base}:due",
        "leased": f"{base}:leased",
        "seq": f"{base}:seq",
        "segments": f"{base}:segments",
        "signal": f"{base}:signal",
        "segment": f"{base}:s:",
        "validators": f"{base}:validators",
    }


def frontier_segment_key(prefix: str, name: str, segment: int, part: str) -> str:
    """One per-segment key of a frontier, e.g. part ``stats`` or ``bloom:1``."""
    return f"{frontier_keys(prefix, name)['segment']}{segment}:{part}"


def control_channel(prefix: str, job: str) -> str:
    """The pub/sub channel of one job's desired state (run / pause / exit): a message
    ``{"job", "state", "changed_at"}`` is published there on every change. The job's name
    goes in verbatim (channel names are binary-safe)."""
    return f"{prefix}control:{job}"


def control_pattern(prefix: str) -> str:
    """The PSUBSCRIBE pattern of every job's control channel, the prefix's glob
    characters escaped so that only this prefix matches."""
    escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}control:*"


def log_keys(prefix: str) -> dict[str, str]:
    """Keys of the log transport: ``stream``, a Redis stream whose entries are batches of
    log lines (field ``lines``), read by the collectors' consumer group
    (``crawlhub.control.logs.transport``)."""
    return {"stream": f"{prefix}logs:stream"}


def dead_stream(prefix: str, family: str) -> str:
    """The Redis stream where readers keep the entries they rejected (malformed, unsigned,
    forged) for inspection, one per reader family: ``center`` (every channel of the
    download center's bus, agents' included), ``logs``, ``control``. One per family, not
    ``<stream>:dead``: channel names hold ids with ``:`` (``agent:x`` and ``agent:x:dead``
    are both agents' channels). Each entry names its source stream and id, and the reason
    (:mod:`crawlhub.core.rejects`); capped at ``rejects.DEAD_MAXLEN`` entries."""
    return f"{prefix}dead:{family}"
