"""Drive a vLLM-Omni ``AsyncOmni`` engine from the worker's synchronous task code.

The engine lives on its own asyncio loop thread for the life of the worker process;
a job streams the engine's outputs through a queue, and a cancelled job aborts its
engine request. Nothing here imports torch or vllm until an engine is built.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.metadata
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from core.errors import (
    ConfigurationError,
    EngineDead,
    EngineRejected,
    EngineStartTimeout,
    JobCancelled,
    JobFailure,
    PipelineFailed,
    clip,
)

from .devices import check_visible

log = logging.getLogger(__name__)

POLL_S = 0.25
ABORT_TIMEOUT_S = 10.0
ENGINE_MESSAGE_LIMIT = 200


def import_object(path: str) -> Any:
    """``"package.module:attr"`` -> the object (engine and tokenizer factories)."""
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import {path} ({type(exc).__name__})") from exc


# What the [gpu] extra brings; CPU installs lack them.
GPU_MODULES = frozenset({"torch", "vllm", "vllm_omni", "transformers"})


def gpu_import(module: str) -> Any:
    """Import a module of the [gpu] extra; on an install without it, say so (and how to
    get it) instead of a bare ModuleNotFoundError from deep inside vllm."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in GPU_MODULES:
            raise
        raise ConfigurationError(
            f"the GPU pipelines need the [gpu] extra (vllm, vllm-omni, torch), which this "
            f"install lacks (no module named '{exc.name}'): install it from a checkout with "
            "pip install -e '.[gpu]', or build Dockerfile.gpu", code="gpu_extra_missing"
        ) from exc


# The engine stack this code is written against; pyproject's [gpu] extra pins the same.
ENGINE_STACK = {"vllm": "0.30.0", "vllm-omni": "0.30.0"}


def installed_stack() -> dict[str, str | None]:
    """The installed version of each distribution of ENGINE_STACK (None: not installed)."""
    found: dict[str, str | None] = {}
    for dist in ENGINE_STACK:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def check_engine_stack(found: Mapping[str, str | None]) -> None:
    """Refuse an engine stack the code was not written for, before anything imports it.

    vllm-omni patches vLLM's v1 engine classes for one vllm line and only warns on a
    mismatch (vllm_omni/version.py:26-49); the engine then breaks deep inside, or in
    ways nobody sees. A missing distribution is left to ``gpu_import``'s message.
    """
    wrong = [f"{dist} {version}" for dist, version in found.items()
             if version is not None and version.split("+")[0] != ENGINE_STACK[dist]]
    if wrong:
        pins = " and ".join(f"{d}=={v}" for d, v in ENGINE_STACK.items())
        raise ConfigurationError(
            f"this install has {', '.join(wrong)}; the GPU pipelines need {pins} (the [gpu] "
            "extra's pins): reinstall with pip install -e '.[gpu]', or build Dockerfile.gpu",
            code="engine_version_mismatch")


CUDA_MAJOR = "13"  # vllm 0.30.0's kernels link libcudart.so.13 (its cu13 requirements)
CUDA_DRIVER = "580"  # the oldest NVIDIA driver the CUDA 13 builds of torch 2.13 run on


def check_torch_build(torch: Any) -> None:
    """Refuse a torch not built for CUDA 13, in one line. Where pip's index offers a CPU
    build (``torch 2.13.0+cpu``) the [gpu] extra installs it without complaint, vLLM
    imports, and the engine then finds no device deep inside its start-up; a CUDA 12
    build (``+cu128``) passes the pin and fails when vLLM loads its kernels. A build
    says its CUDA version in ``torch.version.cuda`` (None for CPU)."""
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if cuda and str(cuda).split(".")[0] == CUDA_MAJOR:
        return
    built = f"built for CUDA {cuda}" if cuda else "built without CUDA"
    raise ConfigurationError(
        f"this install's torch {getattr(torch, '__version__', '?')} is {built}; the GPU "
        f"pipelines need a CUDA {CUDA_MAJOR} build of torch (NVIDIA driver {CUDA_DRIVER} or "
        "newer): pip install --force-reinstall 'torch==2.13.0' --index-url "
        "https://download.pytorch.org/whl/cu130, or build Dockerfile.gpu",
        code="torch_without_cuda")


def visible_gpus(torch: Any) -> int:
    """The GPUs this process sees, counted as vLLM counts them before any CUDA context
    exists (NVML under CUDA_VISIBLE_DEVICES, else the runtime's count; vllm 0.30.0
    platforms/cuda.py:57-80), so the engine's own processes still start clean."""
    if not torch.cuda._is_compiled():
        return 0
    count = torch.cuda._device_count_nvml()
    return torch._C._cuda_getDeviceCount() if count < 0 else count


def startup_kwargs(options: Mapping[str, Any], init_s: float,
                   stage_init_s: float) -> dict[str, Any]:
    """The engine arguments of a pipeline's options (``engine_kwargs``) with its start-up
    bounds: vLLM-Omni's ``init_timeout`` (the whole engine ready, 600 s by default) and
    ``stage_init_timeout`` (a stage's wait for its devices and its config, 300 s),
    entrypoints/omni_base.py:181-182. Those defaults are short for a cold 30B load or a
    six-GPU H3 load with CUDA-graph capture, so each pipeline brings its own; the
    options ``init_timeout_s`` and ``stage_init_timeout_s`` override them."""
    kwargs = dict(options.get("engine_kwargs", {}))
    kwargs["init_timeout"] = int(options.get("init_timeout_s",
                                             kwargs.get("init_timeout", init_s)))
    kwargs["stage_init_timeout"] = int(options.get("stage_init_timeout_s",
                                                   kwargs.get("stage_init_timeout",
                                                              stage_init_s)))
    return kwargs


def build_async_omni(model: str, deploy_config: str | None = None, **kwargs: Any) -> Any:
    """The production engine: ``vllm_omni.AsyncOmni(model, deploy_config=...)``, on the
    engine stack it was written for, with a CUDA torch and the GPUs its deploy names."""
    check_engine_stack(installed_stack())
    torch = gpu_import("torch")
    check_torch_build(torch)
    if deploy_config is not None:
        check_visible(deploy_config, visible_gpus(torch),
                      os.environ.get("CUDA_VISIBLE_DEVICES"))
    if "init_timeout" in kwargs:  # each stage client's own wait for its engine core, read
        # when vllm's core_client is first imported: before anything of vllm_omni is
        os.environ.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", str(kwargs["init_timeout"]))
    vllm_omni = gpu_import("vllm_omni")
    if deploy_config is not None:
        kwargs["deploy_config"] = deploy_config
    return vllm_omni.AsyncOmni(model, **kwargs)


def output_kind(name: str) -> Any:
    """vLLM's RequestOutputKind member; its name where vllm is absent (CPU test installs)."""
    try:
        from vllm.sampling_params import RequestOutputKind
    except ImportError:
        return name
    return getattr(RequestOutputKind, name)


def to_array(value: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like -> numpy, dtype kept (frames stay uint8)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def to_numpy(value: Any) -> np.ndarray:
    """A torch tensor (any device/dtype) or array-like -> float32 numpy (audio)."""
    if hasattr(value, "detach"):
        value = value.detach().float()
    return to_array(value).astype(np.float32, copy=False)


def scalar(value: Any) -> Any:
    """``sr`` arrives as an int, a 0-d tensor, or a list of those (take the last)."""
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else None
    return value.item() if hasattr(value, "item") else value


def stage_names(engine: Any) -> set[str]:
    """The ``model_stage`` of every stage, read as vLLM-Omni's own serving code does."""
    names = set()
    for stage in getattr(engine, "stage_configs", None) or []:
        cfg = getattr(stage, "stage_pipeline_config", None)
        name = getattr(cfg, "model_stage", None) or getattr(
            getattr(stage, "engine_args", None), "model_stage", None)
        if name:
            names.add(str(name))
    return names


def stage_max_num_seqs(engine: Any) -> list[int]:
    """Each stage's ``max_num_seqs`` as the engine resolved it (the deploy yaml under any
    engine-argument override): ``engine_args`` of each stage config
    (config/stage_config.py:1278-1301), an attribute or a key."""
    found = []
    for stage in getattr(engine, "stage_configs", None) or []:
        args = getattr(stage, "engine_args", None)
        value = getattr(args, "max_num_seqs", None)
        if value is None and isinstance(args, Mapping):
            value = args.get("max_num_seqs")
        if value is not None:
            found.append(int(value))
    return found


def is_dead(engine: Any, exc: BaseException) -> bool:
    return bool(getattr(engine, "errored", False)) or "EngineDead" in type(exc).__name__


def is_client_error(exc: BaseException) -> bool:
    """vLLM-Omni's ``OmniClientError``: a ValueError with a 4xx ``status_code``
    (vllm_omni/errors.py:15-34 and :59-60), raised by ``generate`` when a stage refuses
    the request (entrypoints/omni_base.py:545-551, 578-589). Told apart by its shape, as
    vLLM-Omni's own ``client_error_metadata`` does, because ``vllm_omni.errors`` cannot
    be imported without torch on CPU installs."""
    status = getattr(exc, "status_code", None)
    return (isinstance(exc, ValueError) and isinstance(status, int)
            and not isinstance(status, bool) and 400 <= status < 500)


def start_timeout(exc: BaseException) -> TimeoutError | None:
    """The TimeoutError behind an engine's failed start: raised as it is when the whole
    engine misses ``init_timeout`` (omni_engine_base.py:528), or wrapped in the
    ``RuntimeError("Orchestrator initialization failed")`` a stage's failure becomes
    (:473-477), e.g. vLLM's own wait for an engine core (core_client.py:712-724)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        # every real bound carries a message; a bare one is a poll's, e.g. the context of
        # "Orchestrator thread died during startup" (omni_engine_base.py:534-539)
        if isinstance(exc, TimeoutError) and exc.args:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class OmniBridge:
    def __init__(self, factory: Callable[[], Any]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omni-loop",
                                        daemon=True)
        self._thread.start()

        async def build() -> Any:  # engines start background tasks on the running loop
            return factory()

        try:
            self.engine = self._run(build())
        except Exception as exc:
            timeout = start_timeout(exc)
            if timeout is None:
                raise
            raise EngineStartTimeout(
                f"the engine did not start within its start-up bounds "
                f"({clip(str(timeout), 120)}): raise the pipeline option init_timeout_s, or "
                "stage_init_timeout_s, if the model needs longer") from exc

    def _run(self, coro, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def stages(self) -> set[str]:
        return stage_names(self.engine)

    def default_params(self) -> list[Any]:
        """A private deep copy: requests mutate params, including nested extra_args."""
        return copy.deepcopy(list(self.engine.default_sampling_params_list))

    def close(self, timeout_s: float) -> None:
        """The engine's own shutdown (``AsyncOmni.shutdown``: its output task, then its
        stage processes and their GPU memory, entrypoints/async_omni_base.py:577-582,
        omni_base.py:770-772), on its loop, within ``timeout_s``; then the loop stops.
        Without it a worker that exits leaves its stages to the parent-death signal,
        and a fresh worker can start while they still hold the GPU."""
        async def shut() -> None:
            self.engine.shutdown()

        try:
            self._run(shut(), timeout=timeout_s)
        except TimeoutError:
            log.warning("the engine's shutdown did not finish within %g s; exiting anyway",
                        timeout_s)
        except Exception:
            log.warning("the engine's shutdown failed; exiting anyway", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def abort(self, request_id: str) -> None:
        try:
            self._run(self.engine.abort(request_id), timeout=ABORT_TIMEOUT_S)
        except Exception:  # the request may already be gone; the job stops either way
            pass

    def _start(self, prompt: Any, params: list[Any], request_id: str,
               output_modalities: list[str] | None) -> queue.Queue:
        items: queue.Queue = queue.Queue()

        async def pump() -> None:
            try:
                async for out in self.engine.generate(
                        prompt, request_id=request_id, sampling_params_list=params,
                        output_modalities=output_modalities):
                    items.put(("out", out))
                items.put(("end", None))
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                items.put(("error", exc))

        asyncio.run_coroutine_threadsafe(pump(), self._loop)
        return items

    @staticmethod
    def _cancel(request_id: str, is_cancelled: Callable[[], bool]) -> None:
        if is_cancelled():  # the caller's ``finally`` aborts the engine request
            raise JobCancelled("job was cancelled")

    def _translate(self, exc: BaseException) -> JobFailure:
        if is_dead(self.engine, exc):
            return EngineDead(f"inference engine died: {type(exc).__name__}")
        if is_client_error(exc):
            message = str(getattr(exc, "message", None) or exc)
            return EngineRejected("the engine rejected the request: "
                                  + clip(message, ENGINE_MESSAGE_LIMIT))
        return PipelineFailed(f"engine request failed: {type(exc).__name__}")

    def stream(self, prompt: Any, params: list[Any], request_id: str,
               is_cancelled: Callable[[], bool], output_modalities: list[str] | None = None,
               timeout_s: float | None = None) -> Iterator[Any]:
        """Yield the engine's outputs.

        The engine request is aborted whenever this stops early: the job was cancelled,
        the consumer gave up (e.g. invalid output), or the engine went silent for longer
        than ``timeout_s``, which is treated as a hung engine (the process restarts).
        """
        items = self._start(prompt, params, request_id, output_modalities)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        done = False
        try:
            while True:
                try:
                    kind, value = items.get(timeout=POLL_S)
                except queue.Empty:
                    self._cancel(request_id, is_cancelled)
                    if deadline is not None and time.monotonic() > deadline:
                        raise EngineDead(
                            f"engine produced nothing for {timeout_s:.0f} s") from None
                    continue
                if kind != "out":
                    done = True
                    if kind == "error":
                        raise self._translate(value) from value
                    return
                if getattr(value, "finished", False) and finish_reason(value) == "abort":
                    done = True
                    if is_cancelled():
                        raise JobCancelled("job was cancelled")
                    raise PipelineFailed("the engine aborted the request")
                yield value
                done = done or bool(getattr(value, "finished", False))
                if timeout_s is not None:
                    deadline = time.monotonic() + timeout_s
                self._cancel(request_id, is_cancelled)
        finally:
            if not done:
                self.abort(request_id)


def finish_reason(output: Any) -> str | None:
    outs = getattr(output, "outputs", None) or []
    return getattr(outs[0], "finish_reason", None) if outs else None
