"""Object stores: S3-compatible (boto3) for production, local disk for the embedded mode.

Both hand out expiring signed URLs. S3 presigns with SigV4 (against the public
endpoint when clients reach the store by another address than the workers do); the
local store signs ``/v1/objects/<key>`` with HMAC-SHA256 and the API verifies and serves.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import quote, urlencode

from core.errors import NotFound, RangeNotSatisfiable, SignatureInvalid, StorageFailed
from core.settings import Settings

log = logging.getLogger(__name__)

CHUNK = 1 << 20
OBJECTS_PATH = "/v1/objects"  # where the API serves the local store's signed URLs
SIGNATURE = re.compile(r"[0-9a-f]{64}")  # hex HMAC-SHA256, as _sign writes it


def object_key(tenant_id: str, job_id: str, attempt: int, index: int, extension: str) -> str:
    """Deterministic per (job, attempt, output index): a retry of the same attempt
    overwrites its own object, and a stale attempt (its lease reaped) can never overwrite
    the newer attempt's bytes. Keys written before the attempt was named
    (``<tenant>/<job>/<index>.<ext>``) stay where their rows say."""
    return f"{tenant_id}/{job_id}/a{attempt}/{index}.{extension}"


@dataclass(frozen=True)
class ObjectPart:
    """An object's bytes, or the range of them a client asked for."""

    chunks: Iterator[bytes]
    length: int
    content_range: str | None  # set when a range was answered (a 206)


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes, content_type: str) -> None: ...
    def put_file(self, key: str, source: BinaryIO, content_type: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def stream(self, key: str) -> Iterator[bytes]: ...
    def delete(self, keys: list[str]) -> None: ...
    def list_keys(self, prefix: str = "") -> Iterator[str]: ...
    def signed_url(self, key: str, ttl_s: int) -> tuple[str, int]: ...
    def check(self) -> None: ...


class LocalStore:
    """Files under a directory; URLs signed with the service's signing secret."""

    def __init__(self, root: Path, base_url: str, secret: str) -> None:
        self.root = root
        self.base_url = base_url.rstrip("/")
        self._secret = secret.encode()
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise NotFound("object not found")
        return path

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self.put_file(key, io.BytesIO(data), content_type)

    def put_file(self, key: str, source: BinaryIO, content_type: str) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: a reader never sees half an object.
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as f:
                    shutil.copyfileobj(source, f, CHUNK)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise StorageFailed(f"local store write failed: {exc.strerror}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise NotFound("object not found") from exc

    def file(self, key: str) -> Path:
        """The stored file itself, for responses that serve ranges and HEAD from disk."""
        path = self._path(key)
        if not path.is_file():
            raise NotFound("object not found")
        return path

    def open(self, key: str) -> BinaryIO:
        """The stored file, opened now: a delete that lands later (a DELETE, retention)
        cannot cut short a download that already holds it."""
        path = self.file(key)
        try:
            return path.open("rb")
        except FileNotFoundError as exc:
            raise NotFound("object not found") from exc

    def stream(self, key: str) -> Iterator[bytes]:
        source = self.open(key)  # here, not when the first block is asked for

        def chunks() -> Iterator[bytes]:
            with source as f:
                while block := f.read(CHUNK):
                    yield block
        return chunks()

    def delete(self, keys: list[str]) -> None:
        """Remove the files, then every folder they leave empty (``<tenant>/<job>/``), so
        a deleted job leaves nothing behind on disk."""
        root = self.root.resolve()
        for key in keys:
            path = self._path(key)
            path.unlink(missing_ok=True)
            for folder in path.parents:
                if folder == root or not folder.is_relative_to(root):
                    break
                try:
                    folder.rmdir()  # only succeeds when empty
                except OSError:
                    break

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Every stored key under ``prefix`` (half-written ``.part-`` files excluded)."""
        for path in sorted(self.root.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and not path.name.startswith(".part-"):
                yield key

    def _sign(self, key: str, expires: int) -> str:
        return hmac.new(self._secret, f"{key}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, int]:
        expires = int(time.time()) + ttl_s
        query = urlencode({"expires": expires, "signature": self._sign(key, expires)})
        return f"{self.base_url}{OBJECTS_PATH}/{quote(key)}?{query}", expires

    def verify(self, key: str, expires: int, signature: str) -> None:
        if not SIGNATURE.fullmatch(signature) or not hmac.compare_digest(
                self._sign(key, expires), signature):
            raise SignatureInvalid("signature does not match")
        if expires < time.time():
            raise SignatureInvalid("signed URL has expired", code="signature_expired")

    def check(self) -> None:
        if not os.access(self.root, os.W_OK):
            raise StorageFailed("object directory is not writable")


class S3Store:
    """An S3-compatible bucket. botocore errors become StorageFailed (retryable)."""

    def __init__(self, settings: Settings) -> None:
        import boto3
        from botocore.config import Config

        common = dict(
            aws_access_key_id=settings.s3_access_key_id,
            aws_secret_access_key=settings.s3_secret_access_key,
            region_name=settings.s3_region,
            config=Config(signature_version="s3v4",
                          s3={"addressing_style": settings.s3_addressing_style},
                          retries={"max_attempts": 3, "mode": "standard"},
                          # Checksums only where S3 requires them: a CRC over every
                          # upload costs time, and some S3-compatible stores refuse them.
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required",
                          # The parameters are ours (keys we build), not a caller's:
                          # checking each call's against the API model cost ~10 % of
                          # an upload's CPU on the worker.
                          parameter_validation=False,
                          connect_timeout=5),
        )
        self.bucket = settings.s3_bucket
        self._create_bucket = settings.s3_create_bucket
        self._bucket_ready = not settings.s3_create_bucket
        self._client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, **common)
        public = settings.s3_public_endpoint_url or settings.s3_endpoint_url
        self._presigner = boto3.client("s3", endpoint_url=public, **common)
        if settings.s3_create_bucket:
            try:
                self.ensure_bucket()
            except StorageFailed:  # S3 briefly down: start anyway; /readyz reports it
                log.warning("object store unreachable at start-up; bucket not checked")

    def _call(self, what: str, fn, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFound("object not found") from exc
            if code == "InvalidRange":
                raise RangeNotSatisfiable("the range lies past the end of the object",
                                          param="Range") from exc
            raise StorageFailed(f"object store {what} failed: {code or 'error'}") from exc
        except BotoCoreError as exc:
            raise StorageFailed(f"object store {what} failed: {type(exc).__name__}") from exc

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing. Raises StorageFailed (retryable), never
        NotFound, while the store is unreachable or refuses: start-up goes on and the next
        check or upload tries again, so a store that comes up late needs no restart."""
        try:
            self._call("head_bucket", self._client.head_bucket)
        except NotFound:
            try:
                self._call("create_bucket", self._client.create_bucket)
            except StorageFailed as exc:
                try:  # another process may have created it meanwhile
                    self._call("head_bucket", self._client.head_bucket)
                except NotFound:
                    raise StorageFailed(f"bucket '{self.bucket[:64]}' does not exist and "
                                        "could not be created") from exc
        self._bucket_ready = True

    def _ready(self) -> None:
        if not self._bucket_ready:
            self.ensure_bucket()

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self._ready()
        self._call("put", self._client.put_object, Key=key, Body=data, ContentType=content_type)

    def put_file(self, key: str, source: BinaryIO, content_type: str) -> None:
        """Streamed in 8 MB parts, two at a time: at most a few parts are ever in memory,
        whatever the file's size."""
        from boto3.exceptions import S3UploadFailedError
        from boto3.s3.transfer import TransferConfig

        self._ready()
        config = TransferConfig(max_concurrency=2)
        config.max_in_memory_upload_chunks = 2  # s3transfer's knob (boto3 doesn't pass it)
        try:
            self._call("upload", self._client.upload_fileobj, Fileobj=source, Key=key,
                       ExtraArgs={"ContentType": content_type}, Config=config)
        except S3UploadFailedError as exc:
            raise StorageFailed("object store upload failed") from exc

    def get(self, key: str) -> bytes:
        return self._call("get", self._client.get_object, Key=key)["Body"].read()

    def stream(self, key: str) -> Iterator[bytes]:
        body = self._call("get", self._client.get_object, Key=key)["Body"]
        return self._chunks(body)

    @staticmethod
    def _chunks(body) -> Iterator[bytes]:
        """The body's blocks; a connection lost mid-read is an outage (retryable), as a
        failed request is, not a bug."""
        from botocore.exceptions import BotoCoreError

        try:
            yield from body.iter_chunks(CHUNK)
        except BotoCoreError as exc:
            raise StorageFailed(f"object store read failed: {type(exc).__name__}") from exc

    def read_range(self, key: str, byte_range: str | None) -> ObjectPart:
        """The object, or the ``Range`` a client sent (S3 parses and answers it), for a
        player that seeks."""
        extra = {"Range": byte_range} if byte_range else {}
        resp = self._call("get", self._client.get_object, Key=key, **extra)
        return ObjectPart(self._chunks(resp["Body"]), int(resp["ContentLength"]),
                          resp.get("ContentRange") if byte_range else None)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # the API's limit per request
            self._call("delete", self._client.delete_objects,
                       Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]],
                               "Quiet": True})

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        token: dict[str, str] = {}
        while True:
            page = self._call("list", self._client.list_objects_v2, Prefix=prefix, **token)
            for item in page.get("Contents", ()):
                yield item["Key"]
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def signed_url(self, key: str, ttl_s: int) -> tuple[str, int]:
        url = self._presigner.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=ttl_s)
        return url, int(time.time()) + ttl_s

    def check(self) -> None:
        if not self._bucket_ready:
            self.ensure_bucket()
            return
        self._call("head_bucket", self._client.head_bucket)


def make_store(settings: Settings) -> ObjectStore:
    if settings.object_store == "s3":
        return S3Store(settings)
    return LocalStore(settings.objects_dir, settings.public_base_url, settings.signing_secret)
