"""Alert routes: who hears about failed, empty and overlong runs, dead agents and queues
that stopped draining, per job; sent as Slack-compatible JSON to a webhook or by SMTP.

Who calls what
--------------
- **The job runner**, at the end of every run (the plane's ``on_finish`` hook)::

      await plane.alerts.run_finished(spec, run)     # JobSpec, RunRecord

  which notifies ``run_failed`` (status ``failed`` or ``lost``: a non-zero exit, a
  signal, a run that could not start or whose host vanished), ``run_over_time`` (status
  ``timeout``) or ``run_no_items`` (status ``succeeded`` with an item counter at 0, see
  :func:`run_events`). Any other code notifies its own events::

      from crawlhub.control.alerts import run_event
      await plane.alerts.notify(run_event("run_failed", job="shop", run="r-12",
                                          message="exit code 2", exit_code=2))

  :meth:`AlertService.notify` queues the event and returns at once; it never raises (a
  full queue drops the event with a warning in the log).
- **``Services.start()``**, once::

      plane.alerts.start_watch(self.agents, queue_stats)

  ``queue_stats`` is ``async () -> {queue name: row}`` (or a list of rows carrying their
  ``name``, such as ``hub.outbound_stats()``) where a row has ``left`` and ``success``
  (a mapping, or a :class:`crawlhub.queues.base.QueueStats`). The plane's ``close()``
  stops it.
- **The test button** (``POST /alerts/{name}/test``, ``crawlhub alerts test``):
  :meth:`AlertService.test`, one attempt, synchronous, its answer returned.

Routing: a route lists the ``events`` it wants (all five by default). Run events
(``run_*``) reach it when the job matches one of its ``jobs`` glob patterns (none: every
job); ``queue_stalled`` when the queue matches one of its ``queues`` patterns (none: every
queue); ``agent_dead`` reaches every route that lists it (an agent serves many jobs).
A disabled route gets nothing but test messages.

Delivery: a bounded in-process queue, a background task, at most ``concurrency`` sends
at once; a failing target is tried ``1 + retries`` times with a doubling backoff; every
outcome is a row of ``alert_deliveries`` (the newest ``max_deliveries`` kept). The same
event kind about the same job, agent or queue is sent to a route at most once per
``interval`` seconds: the claim is one upsert in the control DB, so two processes
watching the same agents send one alert, not two. A delivery that failed gives its claim
back, so the next occurrence is tried again.

Targets: a webhook URL names a host the *server* connects to, so a route is a way for an
API client to make the server send requests. :class:`TargetPolicy` decides which hosts
it may reach: ``control.alert_allowed_hosts`` (when set, the only hosts taken) and
``control.alert_denied_networks`` (link-local and cloud metadata addresses by default;
loopback and private networks are allowed). It is checked when a route is stored (the
host and what it resolves to then) and again at every delivery (an IP literal before
connecting, a name by the resolver the connection itself uses, so a DNS answer that
changed meanwhile is caught). The answer of a send is only ``HTTP <status>`` and its
time: the target's body is never read back, so a route cannot be used to read internal
URLs.

Secrets: a webhook URL (Slack's embeds its token) is stored encrypted and shown as
``scheme://host/***``; the SMTP password lives in ``control.smtp_url``. Neither is ever
logged, returned or put in an error message.

Modules (each imports only those above it): ``model`` (route specs and their checks,
events, routes, delivery rows), ``targets`` (the :class:`TargetPolicy`), ``settings``,
``render`` (what is sent), ``deliver`` (one send to a webhook or by SMTP), ``watch``
(agents and queues into events), ``service`` (:class:`AlertService`).
"""

from crawlhub.control.alerts.model import (
    EVENT_KINDS,
    AlertError,
    AlertEvent,
    AlertRoute,
    RoutePatch,
    RouteSpec,
    make_spec,
    run_event,
    run_events,
)
from crawlhub.control.alerts.service import AlertService
from crawlhub.control.alerts.settings import AlertSettings, SmtpSettings
from crawlhub.control.alerts.targets import TargetPolicy

__all__ = [
    "EVENT_KINDS",
    "AlertError",
    "AlertEvent",
    "AlertRoute",
    "AlertService",
    "AlertSettings",
    "RoutePatch",
    "RouteSpec",
    "SmtpSettings",
    "TargetPolicy",
    "make_spec",
    "run_event",
    "run_events",
]
