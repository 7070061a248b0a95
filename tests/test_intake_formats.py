"""Parsing: Sentry events (Python, JavaScript, Java; SDK, envelope, webhook, web API shapes),
multi-line traces in log text, JSONL, sniffing, and malformed input named by line."""

import json

from agent.intake.formats import parse, sniff

from intake_payloads import (JAVA_LOG, NODE_LOG, PY_LOG, sentry_api_event, sentry_java_event,
                             sentry_javascript_event, sentry_python_event)


def test_sentry_python_event():
    r = parse(json.dumps(sentry_python_event(), indent=2))
    assert r.format == "sentry" and not r.rejected
    (ev,) = r.events
    assert ev.cls == "KeyError" and ev.message == "'sku-123'"
    assert [f.function for f in ev.frames] == ["inner", "checkout", "price_for"]  # outermost first
    assert ev.frames[0].in_app is False and ev.frames[-1].lineno == 17
    assert (ev.service, ev.environment, ev.release) == ("widgets-api", "production", "widgets@1.4.2")
    assert ev.timestamp == "2024-05-01T10:00:00.123456Z"
    assert "widgets/pricing.py:17 in price_for" in ev.excerpt


def test_sentry_javascript_event():
    (ev,) = parse(json.dumps(sentry_javascript_event())).events
    assert ev.cls == "TypeError" and "reading 'id'" in ev.message
    assert ev.frames[-1].function == "orderLines" and ev.environment == "staging"
    assert ev.timestamp == "2024-05-01T10:00:00.500000Z"  # epoch float


def test_sentry_java_event_with_cause():
    (ev,) = parse(json.dumps(sentry_java_event())).events
    assert ev.cls == "java.lang.IllegalStateException"
    assert ev.causes == ["java.sql.SQLException"]
    assert ev.frames[-1].module == "com.acme.orders.OrderService" and ev.frames[-1].function == "load"
    assert ev.message == "Order 1234 could not be loaded"


def test_sentry_envelope_and_webhooks():
    envelope = "\n".join([
        json.dumps({"event_id": "fc6d8c0c43fc4630ad850ee518f1b9d0", "sent_at": "2024-05-01T10:00:01Z",
                    "dsn": "https://public@o1.ingest.sentry.io/5"}),
        json.dumps({"type": "attachment", "length": 5, "filename": "a.txt"}),
        "hello",
        json.dumps({"type": "event", "length": 100, "content_type": "application/json"}),
        json.dumps(sentry_python_event()),
    ])
    assert sniff(envelope) == "sentry"
    r = parse(envelope)
    assert len(r.events) == 1 and not r.rejected and r.events[0].cls == "KeyError"

    integration = {"action": "triggered", "installation": {"uuid": "x"},
                   "data": {"event": sentry_java_event(), "triggered_rule": "Slack me"}}
    legacy = {"id": "27379932", "project": "orders", "project_slug": "orders", "level": "error",
              "url": "https://sentry.io/acme/orders/issues/27379932/", "event": sentry_javascript_event()}
    for hook, cls in ((integration, "java.lang.IllegalStateException"), (legacy, "TypeError")):
        (ev,) = parse(json.dumps(hook), "sentry").events
        assert ev.cls == cls


def test_sentry_web_api_list_shape():
    doc = [sentry_api_event("e1" * 16, "2024-05-01T10:00:05Z"), {"title": "nothing here"} | {"entries": []}]
    r = parse(json.dumps(doc))
    assert r.format == "sentry"
    assert len(r.events) == 2  # the second has a title (used as the message)
    ev = r.events[0]
    assert ev.cls == "KeyError" and ev.environment == "production" and ev.release == "widgets@1.4.2"
    assert [f.lineno for f in ev.frames] == [42, 17] and ev.frames[0].in_app is True
    r = parse(json.dumps([{"entries": []}, 5]))
    assert [x.reason.split(":")[0] for x in r.rejected] == ["event 1", "event 2"]


def test_python_traceback_in_log_text_is_one_event_with_chain():
    r = parse(PY_LOG)
    assert r.format == "traceback" and not r.rejected
    (ev,) = r.events
    assert ev.cls == "widgets.errors.CheckoutError" and ev.message == "cannot price cart 981"
    assert ev.causes == ["KeyError"]
    assert [f.function for f in ev.frames] == ["checkout"]
    assert ev.line == 2  # the ERROR header line that introduced the traceback
    assert ev.excerpt.startswith("2024-05-01 10:00:01,456 ERROR") and "During handling" in ev.excerpt
    assert ev.timestamp == "2024-05-01T10:00:01.456000Z"


def test_java_trace_with_caused_by():
    (ev,) = parse(JAVA_LOG, "traceback").events
    assert ev.cls == "java.lang.IllegalStateException" and ev.message == "Order 1234 could not be loaded"
    assert ev.causes == ["java.sql.SQLException"]
    assert [(f.module, f.function) for f in ev.frames] == [
        ("java.lang.Thread", "run"), ("com.acme.orders.OrderController", "get"),
        ("com.acme.orders.OrderService", "load")]
    assert ev.platform == "java" and "... 12 more" in ev.excerpt


def test_node_trace():
    (ev,) = parse(NODE_LOG).events
    assert ev.cls == "TypeError" and ev.platform == "node"
    assert ev.frames[-1].function == "getUser" and ev.frames[-1].file == "/app/src/users.js"
    assert ev.frames[-1].lineno == 12


def test_mixed_log_keeps_only_errors_and_counts_lines():
    text = PY_LOG + JAVA_LOG + NODE_LOG + "2024-05-01 10:00:09 ERROR payment gateway timeout after 3000ms\n" \
        + '{"level": "info", "msg": "fine"}\n{"level": "error", "msg": "disk full on /dev/sda1", "service": "w"}\n'
    r = parse(text)
    assert [e.cls for e in r.events] == ["widgets.errors.CheckoutError", "java.lang.IllegalStateException",
                                         "TypeError", "", ""]
    assert r.events[3].message == "payment gateway timeout after 3000ms"
    assert r.events[4].message == "disk full on /dev/sda1" and r.events[4].service == "w"
    assert r.events[1].line == PY_LOG.count("\n") + 1


def test_unfinished_trace_is_held_back_when_tailing():
    partial = "2024-05-01 ERROR boom\nTraceback (most recent call last):\n  File \"/a.py\", line 1, in f\n"
    r = parse("INFO ok\n" + partial, "traceback", final=False)
    assert r.events == [] and r.consumed_lines == 1
    r = parse("INFO ok\n" + partial, "traceback", final=True)
    assert r.rejected and r.rejected[0].line == 3


def test_jsonl_with_rejected_lines_named():
    lines = [
        {"service": "api", "environment": "prod", "level": "error", "message": "Order 7 not found",
         "class": "app.NotFound", "timestamp": "2024-05-01T10:00:00Z", "repo": "acme/api",
         "stack": "Traceback (most recent call last):\n  File \"/app/o.py\", line 9, in get\n"
                  "    raise NotFound(id)\napp.NotFound: Order 7 not found\n"},
        "{not json",
        {"service": "api", "level": "error"},                       # neither message nor class
        {"service": "api", "message": "x", "stack": [{"file": "a.js", "function": "f", "line": 3},
                                                      "at g (/b.js:4:1)"]},
        sentry_python_event(),                                      # a Sentry event as one JSONL line
        [1, 2],
    ]
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    r = parse(text, service="fallback", environment="dev")
    assert r.format == "jsonl"
    assert [(x.line, x.reason.split(" (")[0]) for x in r.rejected] == [
        (2, "not valid JSON"), (3, "record has neither a message nor an exception class"),
        (6, "expected a JSON object")]
    a, b, c = r.events
    assert a.frames[0].function == "get" and a.repo == "acme/api" and a.environment == "prod"
    assert [f.function for f in b.frames] == ["f", "g"] and b.environment == "dev"
    assert c.cls == "KeyError" and c.service == "widgets-api"


def test_sniff():
    assert sniff('{"message": "x"}\n{"message": "y"}\n') == "jsonl"
    assert sniff(json.dumps(sentry_java_event(), indent=1)) == "sentry"
    assert sniff("[]") == "sentry"
    assert sniff(JAVA_LOG) == "traceback"
