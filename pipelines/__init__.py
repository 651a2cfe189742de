"""Model pipelines, one backend per module, registered by name.

Importing a backend module registers its spec and must stay cheap: torch, vllm,
onnxruntime and model weights are loaded inside ``Pipeline.load()`` in the worker.
"""

from .base import (
                   Pipeline,
                   PipelineSpec,
                   RunContext,
                   SpeechRequest,
                   VideoLimits,
                   VideoRequest,
                   VideoResult,
                   queue_for,
)
from .registry import (
                   all_specs,
                   get_pipeline_class,
                   get_spec,
                   import_pipeline_modules,
                   register_pipeline,
                   resolve_model,
                   served_pipelines,
)

__all__ = ["Pipeline", "PipelineSpec", "RunContext", "SpeechRequest", "VideoLimits",
           "VideoRequest", "VideoResult", "all_specs", "queue_for",
           "get_pipeline_class", "get_spec", "import_pipeline_modules", "register_pipeline",
           "resolve_model", "served_pipelines"]
