"""Finalize: validate, encode, re-probe, upload. Runs off the pipeline's inner loop."""

from __future__ import annotations

import hashlib

from ..media.audio import Audio
from ..media.encode import encode_audio
from ..media.probe import probe_audio
from ..media.validate import validate_audio
from ..media.verify import verify_encoded_audio
from ..pipelines import PipelineSpec
from ..storage.objects import ObjectStore
from ..storage.records import JobRecord, OutputRecord


def object_key(job: JobRecord, index: int, extension: str) -> str:
    """Deterministic per (job, output index): a retry overwrites instead of duplicating."""
    return f"{job.tenant_id}/{job.id}/{index}.{extension}"


def finalize_speech(store: ObjectStore, job: JobRecord, spec: PipelineSpec, audio: Audio,
                    response_format: str) -> OutputRecord:
    stats = validate_audio(audio, expected_sample_rate=spec.sample_rate,
                           bounds=spec.audio_bounds)
    encoded = encode_audio(audio, response_format)
    fmt = encoded.format
    probe = probe_audio(encoded.data, container_format=fmt.demuxer,
                        raw_rate=encoded.sample_rate, raw_channels=encoded.channels)
    verify_encoded_audio(probe, sample_rate=encoded.sample_rate, channels=encoded.channels,
                         duration_s=stats.duration_s, codecs=fmt.decoders,
                         silence_rms=spec.audio_bounds.silence_rms)
    key = object_key(job, 0, fmt.extension)
    store.put(key, encoded.data, fmt.content_type)
    return OutputRecord(index=0, key=key, content_type=fmt.content_type,
                        bytes=len(encoded.data), sha256=hashlib.sha256(encoded.data).hexdigest(),
                        duration_s=round(probe.duration_s, 4), sample_rate=probe.sample_rate,
                        channels=probe.channels)
