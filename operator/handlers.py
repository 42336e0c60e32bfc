"""The kopf handlers of the KVFleet resource: reconcile on create/update/resume, clean up on
delete, and a timer that autoscales and converges every tick (drift repair, readiness).

Run with `kvfleet operator` (or `kopf run -m kvfleet.operator.handlers`). Shared objects live in
kopf's memo: `kube` (a KubeApi), `readers`, `histories` and `last_autoscale` (per-fleet
metric state, dropped when the fleet is deleted).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import defaultdict
from typing import Any

import kopf

from .autoscale import Sample, decide
from .conditions import now_rfc3339, set_condition
from .kube import KubeApi
from .metrics import FleetMetricsReader, http_scrape
from .names import FINALIZER, GROUP, PLURAL, VERSION, FleetRef
from .peering import announce_from_memo
from .pool_sizes import size_pools
from .readiness import pool_reports, readiness, report_pool_objects
from .reconcile import delete_children, mark_draining, rank_names, reconcile
from .scaling_state import effective_replicas, policy_for, state_from_status, state_to_status
from .spec import FleetSpec, SpecError, parse_fleet

# How often each fleet's pools are looked at (readiness, autoscaling); the spec's
# autoscaling.intervalSeconds spaces the autoscaler's reads, and cannot be finer than this.
TICK_SECONDS = float(os.environ.get("KVFLEET_OPERATOR_TICK_SECONDS", "10"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Name the finalizer, and build the API client once unless a test already gave one."""
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = 20  # INFO: scaling decisions are worth an Event
    if getattr(memo, "kube", None) is None:
        memo.kube = KubeApi.from_environment()
    if getattr(memo, "scrape", None) is None:
        memo.scrape = http_scrape
    memo.readers = {}
    memo.histories = defaultdict(lambda: defaultdict(list))
    memo.last_autoscale = {}
    memo.locks = defaultdict(threading.Lock)
    memo.generations = {}
    memo.reported = {}  # the spec problem last reported per fleet


@kopf.on.startup(id="announce_to_peers", backoff=2.0)
def announce_to_peers(memo: kopf.Memo, logger, **_: Any) -> None:
    """With peers, write this replica's keep-alive and wait for a live leader to pause: kopf
    starts its peering and watches (and so every handler) only once start-up activities return."""
    announce_from_memo(memo, logger)


def fleet_ref(body: kopf.Body) -> FleetRef:
    """The identity of the fleet a handler was called for."""
    return FleetRef(
        name=body.metadata.name, namespace=body.metadata.namespace, uid=body.metadata.uid
    )


def fleet_key(fleet: FleetRef) -> tuple[str, str, str]:
    """The key of a fleet's entries in the memo."""
    return (fleet.namespace, fleet.name, fleet.uid)


def _conditions(status: kopf.Status) -> list[dict]:
    return [dict(condition) for condition in status.get("conditions", [])]


def _parse_or_report(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo
) -> FleetSpec:
    """The parsed spec; on a bad spec (or a name too long for its children), record it as
    conditions and a Warning Event naming the fields, and stop until the spec changes."""
    generation = body.metadata.get("generation")
    try:
        parsed = parse_fleet(body.metadata.name, dict(spec))
    except SpecError as exc:
        now = now_rfc3339()
        conditions = set_condition(
            _conditions(status), "SpecValid", False, "InvalidSpec", str(exc), generation, now
        )
        conditions = set_condition(
            conditions, "Ready", False, "InvalidSpec", "the spec is invalid", generation, now
        )
        patch.status["conditions"] = conditions
        patch.status["observedGeneration"] = generation
        # kopf may run the handler again for the same spec (a replayed watch event carries
        # the body from before the status write): one Warning per distinct problem.
        key = fleet_key(fleet_ref(body))
        if str(exc) not in (_condition_message(status, "SpecValid"), memo.reported.get(key)):
            kopf.warn(body, reason="InvalidSpec", message=str(exc))
        memo.reported[key] = str(exc)
        raise kopf.PermanentError(f"invalid spec: {exc}") from None
    memo.reported.pop(fleet_key(fleet_ref(body)), None)
    conditions = set_condition(
        _conditions(status), "SpecValid", True, "Valid", "", generation, now_rfc3339()
    )
    patch.status["conditions"] = conditions
    return parsed


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile_fleet(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger,
    **_: Any,
) -> None:
    """Make the children match the spec at once on every spec change."""
    parsed = _parse_or_report(body, spec, status, patch, memo)
    autoscaled = effective_replicas(parsed, status) if parsed.autoscaling.enabled else None
    converge(body, parsed, status, patch, memo, autoscaled, logger)


def converge(
    body: kopf.Body,
    spec: FleetSpec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    autoscaled: dict[str, int] | None,
    logger,
) -> None:
    """One level-triggered pass: pool sizes (drain before scale-in), live children to desired,
    then status from what is live.

    Status keys are written only when their value changed, so an idle fleet costs no writes.
    """
    fleet = fleet_ref(body)
    key = (fleet.namespace, fleet.name, fleet.uid)
    generation = body.metadata.get("generation") or 0
    # One pass at a time per fleet, and never one from a body older than a pass already made
    # (the timer can hold the spec from before an edit the update handler just applied).
    with memo.locks[key]:
        if generation < memo.generations.get(key, 0):
            return
        memo.generations[key] = generation
        _converge(body, fleet, spec, status, patch, memo, autoscaled, logger)


def _converge(body, fleet, spec, status, patch, memo, autoscaled, logger) -> None:
    sizing = size_pools(memo.kube, fleet, spec, status, autoscaled, time.time())
    for name, ordinals in sizing.unmark.items():
        mark_draining(memo.kube, fleet, rank_names(fleet, name, ordinals), False)
    for name, ordinals in sizing.mark.items():
        mark_draining(memo.kube, fleet, rank_names(fleet, name, ordinals), True)
        kopf.info(body, reason="ScaleIn", message=f"{name}: draining {list(ordinals)} first")
    outcome = reconcile(memo.kube, fleet, spec, sizing.replicas, logger)
    report_pool_objects(memo.kube, fleet, spec, outcome, sizing)
    generation = body.metadata.get("generation")
    ready = readiness(outcome)
    now = now_rfc3339()
    conditions = patch.status.get("conditions") or _conditions(status)
    conditions = set_condition(
        list(conditions), "Ready", ready.ready, ready.reason, ready.message, generation, now
    )
    conflict_message = "; ".join(outcome.conflicts)
    if conflict_message and _condition_message(status, "Conflict") != conflict_message:
        kopf.warn(body, reason="Conflict", message=conflict_message)
    conditions = set_condition(
        conditions, "Conflict", bool(conflict_message),
        "NameTaken" if conflict_message else "NoConflict", conflict_message, generation, now,
    )  # fmt: skip
    pools = pool_reports(fleet, spec, outcome)
    scale_in = {**(status.get("scaleIn") or {}), **sizing.scale_in}
    new_status = {
        "scaleIn": {name: entry for name, entry in scale_in.items() if entry} or None,
        "observedGeneration": generation,
        "endpoints": endpoints(fleet, spec),
        "pools": {name: report.as_status() for name, report in pools.items()},
        "conditions": conditions,
    }
    for key, value in new_status.items():
        if status.get(key) != value:
            patch.status[key] = value
        elif key in patch.status:
            del patch.status[key]
    if outcome.actions:
        message = ", ".join(f"{a.verb} {a.kind_name}" for a in outcome.actions)
        kopf.info(body, reason="Reconciled", message=message)


def endpoints(fleet: FleetRef, spec: FleetSpec) -> dict[str, str]:
    """Where clients reach the fleet: the router Service's ports."""
    host = f"{fleet.child_name('router')}.{fleet.namespace}.svc"
    return {
        "grpc": f"{host}:{spec.ports.router_grpc}",
        "http": f"http://{host}:{spec.ports.router_http}/v1",
        "metrics": f"{host}:{spec.ports.router_metrics}",
    }


def _condition_message(status: kopf.Status, type_: str) -> str | None:
    conditions = status.get("conditions", [])
    return next((c.get("message") for c in conditions if c.get("type") == type_), None)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_fleet(body: kopf.Body, memo: kopf.Memo, logger, **_: Any) -> None:
    """Delete every child now rather than waiting for the garbage collector."""
    fleet = fleet_ref(body)
    delete_children(memo.kube, fleet, logger)
    key = fleet_key(fleet)
    for per_fleet in (
        memo.readers, memo.histories, memo.last_autoscale, memo.generations, memo.reported
    ):  # fmt: skip
        per_fleet.pop(key, None)


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_SECONDS, initial_delay=TICK_SECONDS)
async def tick(**kwargs: Any) -> None:
    """Run one look at the fleet in a worker thread; awaiting it keeps the timer cancellable."""
    await asyncio.to_thread(_tick, **kwargs)


def _tick(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger,
    **_: Any,
) -> None:
    """Autoscale when it is on, then converge: drift is repaired within one tick."""
    try:
        parsed = parse_fleet(body.metadata.name, dict(spec))
    except SpecError:
        return  # already reported by the reconcile handler
    autoscaled = None
    if parsed.autoscaling.enabled:
        autoscaled = _autoscale(body, parsed, status, patch, memo, fleet_ref(body), logger)
    converge(body, parsed, status, patch, memo, autoscaled, logger)


def _autoscale(
    body, spec: FleetSpec, status, patch, memo, fleet: FleetRef, logger
) -> dict[str, int]:
    """Read, decide and record; the replicas each pool should have now."""
    key = (fleet.namespace, fleet.name, fleet.uid)
    now = time.time()
    # NOTE: the tick is shared by every fleet; each fleet's own intervalSeconds spaces its reads
    # (a small tolerance so an interval equal to the tick is not skipped by timer jitter).
    replicas = effective_replicas(spec, status)
    if now - memo.last_autoscale.get(key, -math.inf) < spec.autoscaling.interval_seconds * 0.9:
        return replicas
    memo.last_autoscale[key] = now
    reader = memo.readers.setdefault(key, FleetMetricsReader(scrape=memo.scrape))
    history: dict[str, list[Sample]] = memo.histories[key]
    for name, sample in reader.read(memo.kube, fleet, spec, replicas, now).items():
        history[name] = [
            s for s in history[name] if s.at >= now - spec.autoscaling.window_seconds
        ] + [sample]
    recorded: dict[str, Any] = {}
    new_replicas = dict(replicas)
    for name in spec.enabled_pools():
        state = state_from_status(status, name, replicas[name])
        decision = decide(policy_for(spec, name), state, history[name], now)
        recorded[name] = state_to_status(decision, now)
        if decision.action == "hold":
            continue
        logger.info("autoscale %s: %s (%s)", name, decision.action, decision.reason)
        kopf.info(
            body,
            reason=f"Autoscale{name.capitalize()}",
            message=f"{decision.action}: {decision.reason}",
        )
        if decision.action in ("begin_drain", "cancel_drain"):
            leaving = range((state.drain or decision.state.drain).target_replicas, state.replicas)
            mark_draining(
                memo.kube, fleet, rank_names(fleet, name, leaving), decision.action == "begin_drain"
            )
        new_replicas[name] = decision.state.replicas
    patch.status["autoscaling"] = recorded
    return new_replicas
