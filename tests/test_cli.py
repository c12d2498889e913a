"""The specpilot command: generate (text and --json) and its errors."""

import json
import subprocess
import sys

import pytest
from conftest import needs_smollm2


def run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "sglang_specpilot.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@needs_smollm2
@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_generate_json_smollm2(mode):
    p = run("generate", "--prompt", "Say hello.", "--max-new-tokens", "8", "--mode", mode, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"text", "token_ids", "tokens_per_s", "mean_accepted"} <= set(out)
    assert 1 <= len(out["token_ids"]) <= 8 and out["tokens_per_s"] > 0 and out["mean_accepted"] >= 1.0


def test_generate_synthetic_text_mode():
    p = run(
        "generate",
        "--prompt",
        "abc",
        "--model",
        "tiny-llama",
        "--synthetic",
        "--max-new-tokens",
        "5",
        "--mode",
        "spec",
        "--draft-layers",
        "2",
        "--ignore-eos",
    )
    assert p.returncode == 0, p.stderr
    assert "tokens/s" in p.stdout and "mean accepted" in p.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
        (["--model", "tiny-llama"], "tiny-llama"),  # a preset name without --synthetic is no path
        (["--model", "no-such-preset", "--synthetic"], "unknown preset"),
        (["--model", "tiny-llama", "--draft", "tiny-qwen2", "--synthetic"], "tokenizers differ"),
        (["--model", "tiny-llama", "--synthetic", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--model", "tiny-llama", "--synthetic", "--max-new-tokens", "1000", "--max-seq-len", "64"], "context"),
    ],
)
def test_generate_errors(args, needle):
    p = run("generate", "--prompt", "abc", *args)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
