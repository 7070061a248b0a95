"""Realistic error payloads, shaped like what Sentry SDKs, Sentry webhooks, the Sentry web API,
Loki and common runtimes really produce (field names and nesting as documented by those projects)."""

from __future__ import annotations


def sentry_python_event(value: str = "'sku-123'", request_id: str = "a1b2c3", email: str = "alice@example.com",
                        function: str = "price_for") -> dict:
    """A Python SDK store/envelope event payload (Django integration)."""
    return {
        "event_id": "fc6d8c0c43fc4630ad850ee518f1b9d0",
        "timestamp": "2024-05-01T10:00:00.123456Z",
        "platform": "python",
        "level": "error",
        "logger": "django.request",
        "server_name": "web-1",
        "release": "widgets@1.4.2",
        "environment": "production",
        "sdk": {"name": "sentry.python.django", "version": "1.45.0"},
        "tags": {"service": "widgets-api", "request_id": request_id},
        "exception": {"values": [{
            "type": "KeyError", "value": value, "module": None,
            "mechanism": {"type": "django", "handled": False},
            "stacktrace": {"frames": [
                {"filename": "django/core/handlers/exception.py",
                 "abs_path": "/usr/local/lib/python3.11/site-packages/django/core/handlers/exception.py",
                 "function": "inner", "module": "django.core.handlers.exception", "lineno": 55, "in_app": False,
                 "context_line": "        response = get_response(request)"},
                {"filename": "widgets/views.py", "abs_path": "/app/widgets/views.py", "function": "checkout",
                 "module": "widgets.views", "lineno": 42, "in_app": True,
                 "context_line": "    total = price_for(cart)", "vars": {"request_id": request_id}},
                {"filename": "widgets/pricing.py", "abs_path": "/app/widgets/pricing.py", "function": function,
                 "module": "widgets.pricing", "lineno": 17, "in_app": True,
                 "context_line": "    return PRICES[sku]", "vars": {"sku": value}},
            ]},
        }]},
        "request": {"url": "https://shop.example.com/checkout", "method": "POST",
                    "headers": {"Cookie": "sessionid=s3ss10n", "User-Agent": "Mozilla/5.0"}},
        "user": {"email": email, "ip_address": "203.0.113.9"},
        "breadcrumbs": {"values": [{"category": "query", "message": "SELECT 1", "timestamp": 1714557599.0}]},
    }


def sentry_javascript_event(order: int = 17) -> dict:
    """A browser JavaScript SDK event (unhandled rejection)."""
    return {
        "event_id": "0a8772ba1c6e4b5ba7d3d2c8e3f1aa01",
        "platform": "javascript",
        "timestamp": 1714557600.5,
        "level": "error",
        "environment": "staging",
        "release": "web@2.0.0",
        "sdk": {"name": "sentry.javascript.browser", "version": "7.100.0"},
        "tags": {"service": "web"},
        "exception": {"values": [{
            "type": "TypeError", "value": f"Cannot read properties of undefined (reading 'id') for order {order}",
            "mechanism": {"type": "onunhandledrejection", "handled": False},
            "stacktrace": {"frames": [
                {"filename": "app:///static/js/main.3f2a1b9c.js", "function": "?", "in_app": True,
                 "lineno": 1, "colno": 1200},
                {"filename": "app:///src/cart.js", "function": "Cart.total", "lineno": 88, "colno": 14,
                 "in_app": True},
                {"filename": "app:///src/order.js", "function": "orderLines", "lineno": 12, "colno": 3,
                 "in_app": True},
            ]},
        }]},
        "request": {"url": "https://shop.example.com/cart", "headers": {"User-Agent": "Mozilla/5.0"}},
    }


def sentry_java_event(order: int = 1234) -> dict:
    """A Java (Spring Boot) SDK event with a chained cause: Sentry lists the cause first, the raised one last."""
    return {
        "event_id": "5e9a2d7c0b6f4e8d9c1a3b5d7f9e1c3a",
        "platform": "java",
        "timestamp": "2024-05-01T10:00:00.000Z",
        "level": "error",
        "logger": "com.acme.orders.OrderService",
        "environment": "production",
        "release": "orders@3.1.0",
        "sdk": {"name": "sentry.java.spring-boot.jakarta", "version": "7.8.0"},
        "tags": {"service": "orders"},
        "exception": {"values": [
            {"type": "SQLException", "value": "Connection refused", "module": "java.sql",
             "stacktrace": {"frames": [
                 {"module": "org.postgresql.Driver", "function": "connect", "filename": "Driver.java",
                  "lineno": 282, "in_app": False}]}},
            {"type": "IllegalStateException", "value": f"Order {order} could not be loaded", "module": "java.lang",
             "thread_id": 1,
             "stacktrace": {"frames": [
                 {"module": "java.lang.Thread", "function": "run", "filename": "Thread.java", "lineno": 833,
                  "in_app": False},
                 {"module": "com.acme.orders.OrderController", "function": "get",
                  "filename": "OrderController.java", "lineno": 31, "in_app": True},
                 {"module": "com.acme.orders.OrderService", "function": "load", "filename": "OrderService.java",
                  "lineno": 57, "in_app": True},
             ]}},
        ]},
    }


def sentry_api_event(event_id: str, date: str, sku: str = "sku-123") -> dict:
    """An event as GET /api/0/projects/ORG/PROJECT/events/?full=true returns it (entries, camelCase, tag list)."""
    return {
        "id": event_id, "eventID": event_id, "groupID": "1889724436", "projectID": "5",
        "title": f"KeyError: '{sku}'", "message": "", "platform": "python", "type": "error",
        "dateCreated": date, "dateReceived": date, "culprit": "widgets.views in checkout",
        "location": "widgets/pricing.py",
        "tags": [{"key": "environment", "value": "production"}, {"key": "level", "value": "error"},
                 {"key": "server_name", "value": "web-1"}, {"key": "release", "value": "widgets@1.4.2"}],
        "user": {"email": "bob@example.com"},
        "entries": [
            {"type": "exception", "data": {"values": [{
                "type": "KeyError", "value": f"'{sku}'", "module": None,
                "mechanism": {"type": "django", "handled": False},
                "stacktrace": {"frames": [
                    {"filename": "widgets/views.py", "absPath": "/app/widgets/views.py", "function": "checkout",
                     "module": "widgets.views", "lineNo": 42, "colNo": None, "inApp": True,
                     "context": [[42, "    total = price_for(cart)"]], "vars": {}},
                    {"filename": "widgets/pricing.py", "absPath": "/app/widgets/pricing.py",
                     "function": "price_for", "module": "widgets.pricing", "lineNo": 17, "colNo": None,
                     "inApp": True, "context": [[17, "    return PRICES[sku]"]], "vars": {}},
                ], "framesOmitted": None, "hasSystemFrames": True}}], "hasSystemFrames": True,
                "excOmitted": None}},
            {"type": "request", "data": {"url": "https://shop.example.com/checkout", "method": "POST",
                                         "headers": [["Cookie", "sessionid=s3ss10n"]]}},
        ],
    }


PY_LOG = """\
2024-05-01 10:00:00,100 INFO [widgets] GET /health 200
2024-05-01 10:00:01,456 ERROR [django.request] Internal Server Error: /checkout
Traceback (most recent call last):
  File "/app/widgets/views.py", line 42, in checkout
    total = price_for(cart)
  File "/app/widgets/pricing.py", line 17, in price_for
    return PRICES[sku]
KeyError: 'sku-123'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/app/widgets/views.py", line 44, in checkout
    raise CheckoutError(f"cannot price cart {cart.id}")
widgets.errors.CheckoutError: cannot price cart 981
2024-05-01 10:00:02,000 INFO [widgets] GET /health 200
"""

JAVA_LOG = """\
2024-05-01 10:00:02.123 ERROR 1 --- [nio-8080-exec-3] c.a.orders.OrderService : Failed to load order
java.lang.IllegalStateException: Order 1234 could not be loaded
\tat com.acme.orders.OrderService.load(OrderService.java:57)
\tat com.acme.orders.OrderController.get(OrderController.java:31)
\tat java.base/java.lang.Thread.run(Thread.java:833)
Caused by: java.sql.SQLException: Connection refused
\tat org.postgresql.Driver.connect(Driver.java:282)
\tat com.zaxxer.hikari.pool.HikariPool.createPoolEntry(HikariPool.java:476)
\t... 12 more
2024-05-01 10:00:03.000  INFO 1 --- [nio-8080-exec-4] c.a.orders.OrderService : ok
"""

NODE_LOG = """\
/app/src/users.js:12
    return user.id;
                ^

TypeError: Cannot read properties of undefined (reading 'id')
    at getUser (/app/src/users.js:12:20)
    at async Promise.all (index 0)
    at async handler (/app/src/server.js:40:5)
Node.js v20.11.0
"""
