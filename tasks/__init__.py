"""Celery app and tasks: render (workers) and the maintenance process (relay, reaper,
sweeps, retention)."""
