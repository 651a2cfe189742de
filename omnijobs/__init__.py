"""omnijobs: a durable, queue-based job service for generative speech and video."""

__version__ = "0.1.0"
