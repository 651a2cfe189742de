"""``GET /v1/files/<key>``: the embedded mode's signed object URLs (no auth header needed)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from core.errors import NotFound
from storage.objects import LocalStore

from ..deps import Services, services
from ..guard import GuardedRoute, public

router = APIRouter(route_class=GuardedRoute)

CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm",
                 "mp4": "video/mp4"}


@router.get("/v1/files/{key:path}", responses={403: {"description": "Bad or expired signature"}})
@public
def signed_file(key: str, expires: int = Query(), signature: str = Query(max_length=128),
                svc: Services = Depends(services)) -> StreamingResponse:
    """The signature, not a key, grants access: it names one object until ``expires``."""
    store = svc.store
    if not isinstance(store, LocalStore):
        raise NotFound("signed file URLs are served by the object store in this deployment")
    store.verify(key, expires, signature)
    media_type = CONTENT_TYPES.get(key.rsplit(".", 1)[-1], "application/octet-stream")
    return StreamingResponse(store.stream(key), media_type=media_type)
