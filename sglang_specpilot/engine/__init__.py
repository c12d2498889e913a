from .engine import Engine
from .request import GenerationError, GenerationResult, RequestError, RequestFailed, StreamEvent
from .sampling import SamplingParams

__all__ = [
    "Engine",
    "GenerationError",
    "GenerationResult",
    "RequestError",
    "RequestFailed",
    "SamplingParams",
    "StreamEvent",
]
