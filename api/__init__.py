"""The HTTP API: FastAPI app factory, routes, wire schemas, auth, error mapping."""
