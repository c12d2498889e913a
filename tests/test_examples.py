"""Every script in examples/ runs on the CPU with the embedded model and small token counts."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_smollm2

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *args: str, timeout: int = 600, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(EXAMPLES / script), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p


@needs_smollm2
def test_generate_ar_chain_and_tree_agree():
    out = run("generate.py", "--max-new-tokens", "4", "--device", "cpu").stdout
    assert "--- ar:" in out and "--- chain:" in out and "--- tree:" in out
    assert "greedy output identical across modes: True" in out


@needs_smollm2
def test_stream_openai_client():
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run("stream_openai_client.py", "--port", str(port), "--max-tokens", "6").stdout
    assert "tokens streamed from SmolLM2-135M-Instruct" in out


def test_convert_w12(tmp_path):
    from sglang_specpilot.models.presets import preset_config, synthetic_state_dict
    from sglang_specpilot.models.safetensors_loader import save_safetensors_folder
    from sglang_specpilot.models.tokenizer import Tokenizer

    cfg = preset_config("tiny-llama")
    src = tmp_path / "hf"
    save_safetensors_folder(src, cfg, synthetic_state_dict(cfg, seed=1), Tokenizer.synthetic(cfg.vocab_size))
    out = run("convert_w12.py", str(src), str(tmp_path / "w12"), "--max-new-tokens", "3").stdout
    assert "verified: every tensor decodes bit for bit" in out and "verify: good" in out and "->" in out


@needs_smollm2
def test_tau_replay():
    out = run("tau_replay.py", "--new-tokens", "6", "--prompts", "1", "--depth", "3", "--top-k", "2").stdout
    report = json.loads(out)
    assert report["tau_chain"] >= 1.0 and "tau_tree4" in report


def test_sglang_launch_dry_run():
    env = {**os.environ, "DRY_RUN": "1"}
    for mode in ("spec", "w12"):
        p = subprocess.run(["bash", str(EXAMPLES / "sglang_launch.sh")], capture_output=True, text=True,
                           env={**env, "MODE": mode}, timeout=60)  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert "+ specpilot sglang-hook install" in p.stdout and "sglang.launch_server" in p.stdout
    assert (
        "--speculative-algorithm specpilot"
        in subprocess.run(
            ["bash", str(EXAMPLES / "sglang_launch.sh")], capture_output=True, text=True, env=env, timeout=60
        ).stdout
    )


def test_architecture_names_only_files_that_exist():
    import re

    root = EXAMPLES.parent
    text = (root / "ARCHITECTURE.md").read_text()
    paths = set(re.findall(r"`([\w/]+\.py)`", text)) | set(re.findall(r"\b((?:[a-z_]+/)+[a-z_]+\.py)\b", text))
    missing = [p for p in sorted(paths) if not any((base / p).exists() for base in (root, root / "sglang_specpilot"))]
    assert not missing, missing
    for link in re.findall(r"\]\(([^)]+)\)", (root / "README.md").read_text()):  # the README stands on its own
        assert not link.startswith("../"), link
    assert "shared/DESIGN.md" not in (root / "README.md").read_text()
