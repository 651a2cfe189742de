"""``GET /v1/models`` and ``GET /v1/models/{id}``: what this deployment serves, with each
pipeline's limits, under every id a request may name (aliases included)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends
from starlette.convertors import PathConvertor, register_url_convertor

from core.errors import NotFound, clip
from pipelines import all_specs

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import ModelList, ModelPublic

router = APIRouter(route_class=GuardedRoute)


def served_models(svc: Services) -> list[ModelPublic]:
    data = []
    aliases = svc.settings.model_aliases
    for spec in all_specs(svc.settings.pipelines):
        ids = [*spec.models, *(a for a, target in aliases.items()
                               if target in spec.models or target == spec.name)]
        data.extend(ModelPublic(
            id=model_id, pipeline=spec.name, kind=spec.kind.value,
            max_input_chars=spec.max_input_chars, sample_rate=spec.sample_rate,
            max_seconds=spec.video.max_seconds if spec.video else spec.audio_bounds.max_s,
            voices=sorted(spec.voices) if spec.voices else None,
            video=asdict(spec.video) if spec.video else None) for model_id in ids)
    return data


@router.get("/v1/models", response_model=ModelList)
def list_models(svc: Services = Depends(services), _tenant: str = Depends(tenant_id)
                ) -> ModelList:
    return ModelList(data=served_models(svc))


class AnyText(PathConvertor):
    """Like ``path``, but across line breaks too: an id is the caller's text, and a route
    that does not match answers 404 before the key is checked, not 401."""

    regex = r"[\s\S]+"


register_url_convertor("anytext", AnyText())


@router.get("/v1/models/{model:anytext}", response_model=ModelPublic)
def retrieve_model(model: str, svc: Services = Depends(services),
                   _tenant: str = Depends(tenant_id)) -> ModelPublic:
    """What ``client.models.retrieve`` calls. Model ids may hold a slash
    (``piper/en_US-joe-medium``), sent as is or as ``%2F``."""
    for served in served_models(svc):
        if served.id == model:
            return served
    raise NotFound(f"model '{clip(model)}' is not served here; see GET /v1/models",
                   param="model", code="model_not_found")
