"""The flows layer: what each watch scan does (decide, the fixer, PR feedback, follow-up, notification delivery),
with lessons and the proof. Imports adapters and everything below."""
