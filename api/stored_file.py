"""Serving a stored file from the local store: ranges as S3 serves them (and HEAD), from a
file opened before the response starts, and range errors in OpenAI's error shape.

Starlette's ``FileResponse`` stats and opens the path only when the response is sent, so
a DELETE or retention that removes the file in between turned a download into a 500.
Here the route opens the file first (a missing one is a 404); an open file outlives its
unlinking, so a download that started ends with the bytes it started with.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import anyio
from starlette.datastructures import Headers
from starlette.responses import (
    FileResponse,
    MalformedRangeHeader,
    RangeNotSatisfiable,
    Response,
)
from starlette.types import Receive, Scope, Send

from core.errors import InvalidRequest
from core.errors import RangeNotSatisfiable as RangeRefused

from .errors import error_response

PATHSEND = "http.response.pathsend"  # the server would open the path itself: not here


class StoredFileResponse(FileResponse):
    def __init__(self, source: BinaryIO, media_type: str) -> None:
        self._source = source
        super().__init__(Path(source.name), media_type=media_type,
                         stat_result=os.fstat(source.fileno()))

    @asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        yield anyio.wrap_file(self._source)  # closed once the response is sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            refusal = self._range_refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            extensions = {k: v for k, v in scope.get("extensions", {}).items()
                          if k != PATHSEND}
            await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            self._source.close()

    def _range_refusal(self, scope: Scope) -> Response | None:
        """The error answer for a Range header that FileResponse would refuse in plain
        text (malformed: 400; past the end: 416), or None."""
        headers = Headers(scope=scope)
        wanted, if_range = headers.get("range"), headers.get("if-range")
        if wanted is None or scope.get("method", "GET").upper() not in ("GET", "HEAD"):
            return None
        if if_range is not None and not self._should_use_range(if_range):
            return None  # the range is ignored: the whole file is sent
        try:
            self._parse_range_header(wanted, self.stat_result.st_size)
        except MalformedRangeHeader as exc:
            return error_response(InvalidRequest(
                f"invalid Range header: {exc.content}", param="Range", code="invalid_range"))
        except RangeNotSatisfiable as exc:
            response = error_response(RangeRefused(
                f"the range lies past the end of the object ({exc.max_size} bytes)",
                param="Range"))
            response.headers["content-range"] = f"bytes */{exc.max_size}"
            return response
        return None
