"""Persistence: the database (models, sessions, repositories) and the object store."""
