"""SpecPilot: lossless speculative decoding for one GPU, as an engine and an SGLang extension."""

from .config import EngineOptions

__version__ = "0.1.0"
__all__ = ["EngineOptions", "__version__"]
