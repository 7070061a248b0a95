"""Alertmanager webhook payloads (version 4) -> intake events, for `agent serve`'s /hooks/alertmanager.

Only firing alerts become events (a resolved notification says the problem went away; it is not an occurrence).
The alert's labels name the error: ``alertname`` is its class, ``service`` (else ``job``, ``app``) its service,
``environment`` (else ``env``) its environment; the ``summary`` (else ``description``) annotation is the message.
Alerts have no stack, so the fingerprint comes from the normalised message (see intake.fingerprint). The events then
take the same path as `agent error ingest`: ``store.ingest`` redacts, fingerprints and deduplicates them.
"""

from __future__ import annotations

from typing import Any

from agent.intake.formats import Event, ParseResult, Rejected, iso_ts


def parse_alertmanager(doc: Any) -> ParseResult:
    """Events from one webhook document; a document that is not a version-4 payload is one rejection."""
    result = ParseResult(format="alertmanager")
    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
        result.rejected.append(Rejected(1, "not an Alertmanager webhook payload (no alerts list)"))
        return result
    if str(doc.get("version")) != "4":
        result.rejected.append(Rejected(1, f"expected Alertmanager webhook version 4, got {doc.get('version')!r}"))
        return result
    common = doc.get("commonLabels") if isinstance(doc.get("commonLabels"), dict) else {}
    for i, alert in enumerate(doc["alerts"], start=1):
        if not isinstance(alert, dict):
            result.rejected.append(Rejected(1, f"alert {i}: expected an object"))
            continue
        if alert.get("status", doc.get("status")) != "firing":
            continue
        labels = {**common, **(alert.get("labels") if isinstance(alert.get("labels"), dict) else {})}
        notes = alert.get("annotations") if isinstance(alert.get("annotations"), dict) else {}
        name = labels.get("alertname")
        if not isinstance(name, str) or not name.strip():
            result.rejected.append(Rejected(1, f"alert {i}: no alertname label"))
            continue
        message = str(notes.get("summary") or notes.get("description") or name)
        service = labels.get("service") or labels.get("job") or labels.get("app")
        excerpt = "\n".join([f"{name}: {message}"]
                            + [f"{k}: {v}" for k, v in sorted(notes.items()) if k != "summary"]
                            + [f"label {k}={v}" for k, v in sorted(labels.items())]
                            + ([f"source: {alert['generatorURL']}"] if alert.get("generatorURL") else []))
        result.events.append(Event(
            message=message, cls=name, service=str(service) if service else None,
            environment=str(labels.get("environment") or labels.get("env") or "") or None,
            level=str(labels.get("severity") or "error").lower(), timestamp=iso_ts(alert.get("startsAt")),
            repo=labels.get("repo") if isinstance(labels.get("repo"), str) else None, excerpt=excerpt, line=1))
    return result
