"""Pipeline registry: name -> class, and model id -> pipeline resolution."""

from __future__ import annotations

import importlib

from core.errors import ConfigurationError, ModelNotFound, clip

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


def served_pipelines(requested: list[str] | None, enabled: list[str]) -> list[str]:
    """The pipelines a worker serves: those it was asked for (``--pipeline``), or every
    enabled one. A pipeline outside ``OMNIJOBS_PIPELINES`` is refused: the API reads the
    same list, so it would answer 404 for the model while the worker waited for jobs."""
    names = requested or enabled
    for name in names:
        get_spec(name)  # registered at all
    missing = [name for name in names if name not in enabled]
    if missing:
        raise ConfigurationError(
            f"pipeline '{clip(missing[0])}' is not in OMNIJOBS_PIPELINES "
            f"({', '.join(enabled) or 'empty'}), the list the API accepts models from: add "
            "it there, for the API and every worker alike", code="pipeline_not_enabled")
    return names


def resolve_model(model: str, enabled: list[str], aliases: dict[str, str]) -> PipelineSpec:
    """Map a request's model id (or alias) to the enabled pipeline that serves it."""
    target = aliases.get(model, model)
    for name in enabled:
        spec = get_spec(name)
        if target in spec.models or target == spec.name:
            return spec
    raise ModelNotFound(f"model '{clip(model)}' is not served here; see GET /v1/models",
                        param="model")
