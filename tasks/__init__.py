"""Celery app and tasks: render, maintenance (outbox relay, lease reaper)."""
