"""``GET /v1/models``: what this deployment serves, with each pipeline's limits."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends

from pipelines import all_specs

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import ModelList, ModelPublic

router = APIRouter(route_class=GuardedRoute)


@router.get("/v1/models", response_model=ModelList)
def list_models(svc: Services = Depends(services), _tenant: str = Depends(tenant_id)
                ) -> ModelList:
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
    return ModelList(data=data)
