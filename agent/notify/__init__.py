"""Notification channels (an adapter): Slack, a signed webhook, email. ``agent.notify.channels`` renders an outbox
row into a message and sends it; the delivery passes that decide what to send when are ``agent.flows.notify``."""
