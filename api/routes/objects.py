"""``GET /v1/objects/<key>``: the embedded mode's signed object URLs (no auth header
needed: the signature names one object until it expires). ``LocalStore.signed_url``
writes these URLs with the same ``OBJECTS_PATH``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from core.errors import NotFound
from storage.objects import OBJECTS_PATH, LocalStore

from ..deps import Services, services
from ..guard import GuardedRoute, public
from ..stored_file import StoredFileResponse

router = APIRouter(route_class=GuardedRoute)

CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm",
                 "mp4": "video/mp4"}


@router.api_route(OBJECTS_PATH + "/{key:path}", methods=["GET", "HEAD"],
                  responses={403: {"description": "Bad or expired signature"},
                             206: {"description": "The byte range asked for"}})
@public
def signed_object(key: str, expires: int = Query(), signature: str = Query(max_length=128),
                  svc: Services = Depends(services)) -> StoredFileResponse:
    """Byte ranges (206, ``Accept-Ranges``, ``Content-Range``) as S3 serves them, so a
    browser's ``<video>`` can seek, and HEAD, which S3's presigned URLs refuse (they are
    signed for GET alone). An object deleted meanwhile is a 404; one being
    sent when it is deleted is sent whole."""
    store = svc.store
    if not isinstance(store, LocalStore):
        raise NotFound("signed object URLs are served by the object store in this deployment")
    store.verify(key, expires, signature)
    media_type = CONTENT_TYPES.get(key.rsplit(".", 1)[-1], "application/octet-stream")
    return StoredFileResponse(store.open(key), media_type)
