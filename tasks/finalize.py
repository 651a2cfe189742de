"""Finalize: validate, encode or mux, re-probe, upload. Runs beside generation, not in it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from core.errors import EncodingFailed, JobCancelled, OutputInvalid
from media.audio import Audio
from media.encode import FORMATS, encode_audio, target_rate
from media.mux import mux_mp4, remux_faststart
from media.preview import spritesheet, thumbnail
from media.probe import probe_audio, probe_video
from media.validate import AudioBounds, validate_audio
from media.verify import (
    check_container,
    check_encoded_sync,
    verify_encoded_audio,
    verify_encoded_video,
)
from media.video import check_rate, check_sync, coerce_fps, even_size, pair_audio, to_fhwc
from pipelines import PipelineSpec, VideoRequest, VideoResult
from storage.objects import ObjectStore, object_key
from storage.records import PREVIEWS, JobRecord, OutputRecord

Guard = Callable[[], None]  # raises JobCancelled when the job is no longer ours
PREVIEW_TYPE = "image/webp"  # a video's previews, as OpenAI's API serves them


def output_key(job: JobRecord, index: int, extension: str) -> str:
    """Where this attempt's output ``index`` goes (``<tenant>/<job>/a<attempt>/...``):
    every object a job's attempt writes takes its key from here."""
    return object_key(job.tenant_id, job.id, job.attempts, index, extension)


def _upload(store: ObjectStore, guard: Guard, key: str, data: bytes, content_type: str) -> str:
    guard()
    store.put(key, data, content_type)
    return hashlib.sha256(data).hexdigest()


def finalize_speech(store: ObjectStore, job: JobRecord, spec: PipelineSpec, audio: Audio,
                    response_format: str, guard: Guard = lambda: None) -> OutputRecord:
    stats = validate_audio(audio, expected_sample_rate=spec.sample_rate,
                           bounds=spec.audio_bounds)
    encoded = encode_audio(audio, response_format)
    fmt = encoded.format
    probe = probe_audio(encoded.data, container_format=fmt.demuxer,
                        raw_rate=encoded.sample_rate, raw_channels=encoded.channels)
    verify_encoded_audio(probe, sample_rate=encoded.sample_rate, channels=encoded.channels,
                         duration_s=stats.duration_s, codecs=fmt.decoders,
                         silence_rms=spec.audio_bounds.silence_rms)
    key = output_key(job, 0, fmt.extension)
    sha = _upload(store, guard, key, encoded.data, fmt.content_type)
    return OutputRecord(index=0, key=key, content_type=fmt.content_type,
                        bytes=len(encoded.data), sha256=sha,
                        duration_s=round(probe.duration_s, 4), sample_rate=probe.sample_rate,
                        channels=probe.channels)


def split_videos(videos, expected: int) -> list[np.ndarray]:
    """A (B, F, H, W, C)-like batch or a list of clips -> one array per output."""
    if videos is None:
        raise OutputInvalid("no video generated", code="no_frames")
    clips = list(videos) if isinstance(videos, (list, tuple)) else None
    if clips is None:
        arr = np.asarray(videos)
        clips = list(arr) if arr.ndim == 5 else [arr]
    if len(clips) != expected:
        raise OutputInvalid(f"{len(clips)} videos generated, {expected} requested",
                            code="video_count_mismatch")
    return clips


def _video_output(store: ObjectStore, guard: Guard, job: JobRecord, index: int,
                  clip: np.ndarray, fps: int, track: np.ndarray | None,
                  sample_rate: int | None, expected_frames: int | None,
                  bounds: AudioBounds) -> list[OutputRecord]:
    frames = even_size(to_fhwc(clip))
    if expected_frames is not None and frames.shape[0] != expected_frames:
        raise OutputInvalid(f"{frames.shape[0]} frames generated, {expected_frames} declared",
                            code="frame_count_mismatch")
    audio = None
    if track is not None:
        audio = Audio(samples=track, sample_rate=check_rate(sample_rate))
        check_sync(frames.shape[0], fps, audio.frames, audio.sample_rate)
        validate_audio(audio, expected_sample_rate=None, bounds=bounds)
    data = mux_mp4(frames, fps, audio)
    probe = probe_video(data)
    verify_encoded_video(probe, frames=frames.shape[0], fps=fps, width=frames.shape[2],
                         height=frames.shape[1], audio_s=audio.duration_s if audio else None,
                         sample_rate=target_rate(FORMATS["aac"], audio.sample_rate)
                         if audio else None,
                         channels=audio.channels if audio else None,
                         silence_rms=bounds.silence_rms)
    key = output_key(job, index, "mp4")
    sha = _upload(store, guard, key, data, "video/mp4")
    return [_record(index, key, data, sha, probe), *_previews(store, guard, job, index, data)]


def _record(index: int, key: str, data: bytes, sha: str, probe) -> OutputRecord:
    return OutputRecord(
        index=index, key=key, content_type="video/mp4", bytes=len(data), sha256=sha,
        duration_s=round(probe.duration_s, 4), width=probe.width, height=probe.height,
        fps=round(probe.fps, 3), frames=probe.frames,
        sample_rate=probe.audio.sample_rate if probe.audio else None,
        channels=probe.audio.channels if probe.audio else None)


def _preencoded_output(store: ObjectStore, guard: Guard, job: JobRecord, index: int,
                       data: bytes, request: VideoRequest, declared: tuple[int, int, int],
                       want_audio: bool, bounds: AudioBounds) -> list[OutputRecord]:
    """An MP4 the pipeline already muxed: probe it, check it, upload it never re-encoded.
    One whose index is at the end, or with sound nobody asked for, is remuxed by stream
    copy first (faststart, the audio track left out)."""
    probe = probe_video(data)
    unwanted_audio = probe.audio is not None and not want_audio
    if probe.frames > 0 and (not probe.faststart or unwanted_audio):
        data = remux_faststart(data, keep_audio=want_audio)
        probe = probe_video(data)
    if probe.frames <= 0 or probe.fps <= 0:
        raise OutputInvalid("pre-encoded video has no frames", code="no_frames")
    fps = coerce_fps(probe.fps)
    check_container(probe)
    frames, width, height = declared
    if (probe.width, probe.height) != (width, height):
        raise EncodingFailed(f"pre-encoded video is {probe.width}x{probe.height}, expected "
                             f"{width}x{height}", code="video_mismatch")
    if fps == request.fps and probe.frames != frames:
        raise OutputInvalid(f"{probe.frames} frames generated, {frames} declared",
                            code="frame_count_mismatch")
    if want_audio and probe.audio is None:
        raise EncodingFailed("pre-encoded video has no audio track", code="audio_missing")
    if probe.audio is not None:
        validate_audio(Audio(probe.audio.samples, probe.audio.sample_rate),
                       expected_sample_rate=None, bounds=bounds)
        check_encoded_sync(probe)
    key = output_key(job, index, "mp4")
    sha = _upload(store, guard, key, data, "video/mp4")
    return [_record(index, key, data, sha, probe), *_previews(store, guard, job, index, data)]


PREVIEW_MAKERS = {"thumbnail": thumbnail, "spritesheet": spritesheet}


def _previews(store: ObjectStore, guard: Guard, job: JobRecord, index: int,
              mp4: bytes) -> list[OutputRecord]:
    """Video ``index``'s thumbnail and spritesheet, made from its stored bytes (rows of
    their own, keyed beside it: ``<index>.<variant>.webp``)."""
    records = []
    for variant in PREVIEWS:
        image = PREVIEW_MAKERS[variant](mp4)
        key = output_key(job, index, f"{variant}.webp")
        sha = _upload(store, guard, key, image.data, PREVIEW_TYPE)
        records.append(OutputRecord(index=index, key=key, content_type=PREVIEW_TYPE,
                                    bytes=len(image.data), sha256=sha, width=image.width,
                                    height=image.height, variant=variant))
    return records


def finalize_video(store: ObjectStore, job: JobRecord, spec: PipelineSpec,
                   result: VideoResult, request: VideoRequest, guard: Guard = lambda: None,
                   progress: Callable[[float], None] = lambda _f: None) -> list[OutputRecord]:
    want_audio = request.generate_audio and spec.video is not None and spec.video.makes_audio
    bounds = AudioBounds(min_s=0.0, max_s=spec.video.max_seconds + 1.0,
                         silence_rms=spec.audio_bounds.silence_rms)
    declared = spec.video.rendered(request)  # the model's frame/size grid, not the ask
    if result.mp4 is not None:
        if len(result.mp4) != request.n:
            raise OutputInvalid(f"{len(result.mp4)} videos generated, {request.n} requested",
                                code="video_count_mismatch")
        return [record for i, data in enumerate(result.mp4) for record in _preencoded_output(
            store, guard, job, i, data, request, declared, want_audio, bounds)]
    fps = coerce_fps(result.fps)
    clips = split_videos(result.videos, request.n)
    tracks = pair_audio(result.audio, len(clips)) if want_audio else [None] * len(clips)
    if want_audio and any(t is None for t in tracks):
        raise OutputInvalid("audio was requested but not generated", code="no_audio")
    expected = declared[0] if abs(fps - request.fps) < 1e-6 else None
    outputs = []
    for i, (clip, track) in enumerate(zip(clips, tracks, strict=True)):
        outputs += _video_output(store, guard, job, i, clip, fps, track,
                                 result.audio_sample_rate, expected, bounds)
        progress((i + 1) / len(clips))
    return outputs


def cancelled_guard(is_cancelled: Callable[[], bool]) -> Guard:
    def guard() -> None:
        if is_cancelled():
            raise JobCancelled("job was cancelled")
    return guard
