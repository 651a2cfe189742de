"""Pure functions on arrays and bytes: aggregate, validate, encode, mux, probe."""
