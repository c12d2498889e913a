from .engine import Engine
from .request import GenerationResult, RequestError, StreamEvent
from .sampling import SamplingParams

__all__ = ["Engine", "GenerationResult", "RequestError", "SamplingParams", "StreamEvent"]
