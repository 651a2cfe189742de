"""The exit codes a worker process and its supervisor agree on. A module of its own so
the supervisor, which only waits for its child, imports nothing heavier than this."""

RESTART_EXIT = 75  # EX_TEMPFAIL: "start me again"
