"""PENDING FIGURES: rows for features that are not built yet.

Each function takes the same arguments a measured figure will need (the API's base URL
and an API key) and, until its feature exists, returns a row that says what it is
waiting for instead of a number. Replace the body with the measurement when it lands
(the batch figure has landed: bench/batch_figure.py):

- streaming speech: a ten-sentence text with ``stream_format: "audio"``; time from the
  request to the first audio byte, p50 over a few rounds, beside the first sentence's
  in-process synthesis time.
"""

from __future__ import annotations

from .report import Figure, pending


def streaming_first_byte(base_url: str | None, key: str | None) -> Figure:
    return pending("stream_first_byte",
                   "streaming speech: time to first audio byte, ten-sentence text",
                   "-", "streaming speech")
