"""Pipeline registry: name -> class, and model id -> pipeline resolution."""

from __future__ import annotations

import importlib

from core.errors import ModelNotFound, clip

from .base import Pipeline, PipelineSpec

_REGISTRY: dict[str, type[Pipeline]] = {}

BUILTIN_MODULES = ("pipelines.piper_tts", "pipelines.reference_t2va",
                   "pipelines.audex", "pipelines.t2va")


def register_pipeline(cls: type[Pipeline]) -> type[Pipeline]:
    name = cls.spec.name
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"pipeline {name!r} is already registered")
    _REGISTRY[name] = cls
    return cls


def import_pipeline_modules(extra: list[str] | tuple[str, ...] = ()) -> None:
    for module in (*BUILTIN_MODULES, *extra):
        importlib.import_module(module)


def get_pipeline_class(name: str) -> type[Pipeline]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ModelNotFound(f"pipeline '{clip(name)}' is not registered; the registered "
                            f"ones are {', '.join(sorted(_REGISTRY))}") from None


def get_spec(name: str) -> PipelineSpec:
    return get_pipeline_class(name).spec


def all_specs(enabled: list[str]) -> list[PipelineSpec]:
    return [get_spec(name) for name in enabled]


def resolve_model(model: str, enabled: list[str], aliases: dict[str, str]) -> PipelineSpec:
    """Map a request's model id (or alias) to the enabled pipeline that serves it."""
    target = aliases.get(model, model)
    for name in enabled:
        spec = get_spec(name)
        if target in spec.models or target == spec.name:
            return spec
    raise ModelNotFound(f"model '{clip(model)}' is not served here; see GET /v1/models",
                        param="model")
