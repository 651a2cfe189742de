"""A fake vLLM-Omni ``AsyncOmni`` with the real output shapes, for CPU tests.

It is the GPU boundary and nothing more: stage configs named as in vLLM-Omni's deploy
yamls, default sampling params per stage, ``generate`` as an async generator of
request outputs whose ``multimodal_output`` is a Mapping ("audio" or "model_outputs",
"sr" as a list of 0-d tensors), cumulative snapshots with empty and shorter trailing
ones, zero codec tokens as empty audio, TTA capped at 10 s, T2VA frames with (B, 2, N)
32 kHz audio at 24 fps or pre-encoded MP4s with ``audio: [None]``, ``abort``, and an
engine that dies. Prompt markers choose the behaviour: ``[silent]``, ``[slow]``,
``[die]`` (once per ``die_marker`` file), ``[model_outputs]``, ``[hang]``,
``[engine-abort]``.
"""

from __future__ import annotations

import asyncio
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

DEPLOYS = {
    "audex_tts.yaml": ("audex_thinker", "audex_code2wav"),
    "audex_tts_30b.yaml": ("audex_thinker", "audex_code2wav"),
    "audex_tta.yaml": ("audex_tta_thinker", "audex_xcodec"),
    "audex_tta_30b.yaml": ("audex_tta_thinker", "audex_xcodec"),
    "audex_s2s.yaml": ("audex_omni", "audex_code2wav"),
    "audex_thinker_only.yaml": ("audex_omni",),
    "minimax_h3_disaggregated.yaml": ("encoder", "dit"),
}
SR = 16000
TTA_CAP_S = 10.0


class FakeEngineDeadError(RuntimeError):
    """Named like vLLM-Omni's OmniEngineDeadError."""


@dataclass
class SamplingParams:
    temperature: float = 0.1
    top_k: int = 80
    max_tokens: int = 2048
    seed: int = 0
    output_kind: Any = None
    extra_args: dict | None = None


@dataclass
class DiffusionParams:
    num_outputs_per_prompt: int = 1
    seed: int | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int = 1
    fps: float | None = None
    frame_rate: float | None = None
    guidance_scale: float | None = None
    extra_args: dict = field(default_factory=dict)


def tensor(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def speech(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    return tensor(0.3 * envelope * np.sin(2 * np.pi * 180 * t))


def output(mm: dict | None = None, *, finished: bool, reason: str | None = None,
           images: list | None = None) -> SimpleNamespace:
    return SimpleNamespace(finished=finished, images=images or [],
                           outputs=[SimpleNamespace(finish_reason=reason)],
                           multimodal_output=mm or {})


class FakeOmni:
    def __init__(self, model: str, deploy_config: str | None = None, **kwargs: Any) -> None:
        self.model = model
        self.stages = DEPLOYS[deploy_config or "audex_tts.yaml"]
        self.stage_configs = [SimpleNamespace(stage_pipeline_config=SimpleNamespace(
            model_stage=name)) for name in self.stages]
        if self.stages[0] == "encoder":
            self.default_sampling_params_list = [SamplingParams(), DiffusionParams(
                height=720, width=1280, num_frames=121, fps=24, guidance_scale=4.0)]
        else:
            tta = self.stages[0] == "audex_tta_thinker"
            self.default_sampling_params_list = [
                SamplingParams(temperature=1.0 if tta else 0.1,
                               max_tokens=4200 if tta else 2048, extra_args={}),
                SamplingParams(temperature=0.0, max_tokens=8192)][:len(self.stages)]
        self.die_marker = kwargs.get("die_marker")
        self.requests: list[dict] = []
        self.aborted: list[str] = []
        self.errored = False

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        self.aborted.append(request_id)

    async def generate(self, prompt: dict, sampling_params: Any = None, request_id: str = "",
                       *, sampling_params_list: list | None = None,
                       output_modalities: list[str] | None = None):
        params = sampling_params_list or self.default_sampling_params_list
        self.requests.append({"prompt": prompt, "params": copy.deepcopy(params),
                              "request_id": request_id, "modalities": output_modalities})
        text = prompt["prompt"]
        if "[die]" in text and self.die_marker and not Path(self.die_marker).exists():
            Path(self.die_marker).touch()
            self.errored = True
            raise FakeEngineDeadError("EngineCore died")
        if self.stages[0] == "encoder":
            yield self._video(params[1], prompt)
            return
        async for out in self._audio(text, request_id):
            yield out

    async def _audio(self, text: str, request_id: str):
        tta = self.stages[0] == "audex_tta_thinker"
        spoken = re.search(r"(?:transcription|caption)\.(.*?)<\|im_end\|>", text, re.S)
        words = len(re.findall(r"\w+", spoken.group(1) if spoken else text))
        seconds = min(TTA_CAP_S, 0.4 * words) if tta else 0.25 * words
        key = "model_outputs" if "[model_outputs]" in text else "audio"
        sr = [np.array(SR, dtype=np.int32)]
        if "[hang]" in text:
            await asyncio.sleep(30)
        if "[engine-abort]" in text:  # preempted by the engine, not by the caller
            yield output(None, finished=True, reason="abort")
            return
        if "[silent]" in text:  # zero codec tokens: an empty waveform on a finished output
            yield output({key: tensor([]), "sr": sr}, finished=True, reason="stop")
            return
        full = speech(seconds)
        steps = [0, len(full) // 3, 2 * len(full) // 3, len(full)]
        for end in steps:
            if request_id in self.aborted:
                yield output(None, finished=True, reason="abort")
                return
            await asyncio.sleep(0.4 if "[slow]" in text else 0)
            yield output({key: full[:end], "sr": sr}, finished=False)
        # trailing snapshots: an empty one and a shorter one, as history lists do
        yield output({key: [full[:0], full, full[: len(full) // 2]], "sr": sr},
                     finished=True, reason="stop")

    def _video(self, gp: DiffusionParams, prompt: dict) -> SimpleNamespace:
        n, frames, h, w = gp.num_outputs_per_prompt, gp.num_frames, gp.height, gp.width
        fps, rate = 24, 32000
        meta = {"audio": {"sample_rate": rate}, "video": {"fps": fps}}
        if gp.extra_args.get("preencode_mp4"):
            from media.audio import Audio
            from media.mux import mux_mp4

            clips = [mux_mp4(self._frames(frames, h, w, i), fps,
                             Audio(self._audio_track(frames / fps, rate), rate))
                     for i in range(n)]
            return output({"metadata": meta, "audio": [None] * n, "audio_sample_rate": rate,
                           "fps": fps}, finished=True, reason="stop", images=clips)
        images = [self._frames(frames, h, w, i) for i in range(n)]
        audio = np.stack([self._audio_track(frames / fps, rate) for _ in range(n)])
        return output({"metadata": meta, "audio": audio, "audio_sample_rate": rate,
                       "fps": fps}, finished=True, reason="stop", images=images)

    @staticmethod
    def _frames(frames: int, h: int, w: int, seed: int) -> np.ndarray:
        base = np.random.default_rng(seed).integers(0, 200, (1, h, w, 3), dtype=np.uint8)
        return base + (np.arange(frames, dtype=np.uint8) % 50)[:, None, None, None]

    @staticmethod
    def _audio_track(seconds: float, rate: int) -> np.ndarray:
        t = np.arange(round(seconds * rate)) / rate
        return tensor(np.stack([0.3 * np.sin(2 * np.pi * 220 * t),
                                0.3 * np.sin(2 * np.pi * 330 * t)]))


ENGINES: list[FakeOmni] = []


def make_engine(model: str, deploy_config: str | None = None, **kwargs: Any) -> FakeOmni:
    engine = FakeOmni(model, deploy_config, **kwargs)
    ENGINES.append(engine)
    return engine


class FakeTokenizer:
    """Special tokens, words and punctuation are one token each; codec tokens exist."""

    _pattern = re.compile(r"<[^<>]+>|\w+|[^\w\s]")

    def encode(self, text: str) -> list[int]:
        return [hash(t) % 100000 for t in self._pattern.findall(text)]

    def get_vocab(self) -> dict[str, int]:
        vocab = {"<audiogen_start>": 131073, "<audiogen_end>": 131074}
        vocab.update({f"<audiocodec_{i}>": 196613 + i for i in range(8192)})
        return vocab


def make_tokenizer(model: str) -> FakeTokenizer:
    return FakeTokenizer()
