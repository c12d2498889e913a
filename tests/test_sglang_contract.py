"""Contract tests against the real sglang==0.5.10.post1 on the CPU: arguments, algorithm -> worker, the
registration in fresh interpreters, and the W12 linear method through SGLang's interfaces.

SGLang cannot run a model here (no GPU): these check what the plugin promises SGLang, not serving.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from sglang_specpilot.sglang_plugin import hook_install
from tests.sglang_support import import_sglang, needs_sglang

pytestmark = needs_sglang
ROOT = Path(__file__).resolve().parents[1]

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 96,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def sglang():
    import_sglang()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return d


def test_server_args_parse_specpilot_and_w12(sglang, model_dir):
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(
        [
            "--model-path", str(model_dir),
            "--speculative-algorithm", "specpilot",
            "--speculative-draft-model-path", str(model_dir),
            "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "2",
            "--speculative-num-draft-tokens", "6",
            "--quantization", "w12",
            "--device", "cpu",
        ]
    )  # fmt: skip
    assert args.speculative_algorithm == "SPECPILOT"
    assert args.quantization == "w12"
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 2, 6)
    # SGLang's STANDALONE decisions were taken, and our worker's: the non-overlap scheduler.
    assert args.disable_overlap_schedule is True and args.max_running_requests == 48
    assert args.get_model_config().quantization == "w12"  # ModelConfig accepts the registered name


def test_unknown_algorithms_still_refused(sglang):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--speculative-algorithm", "specpilotx"])
    assert parser.parse_args(["--model-path", "m", "--speculative-algorithm", "SPECPILOT"]).speculative_algorithm


def test_algorithm_maps_to_our_worker(sglang):
    from sglang.srt.speculative.eagle_worker import EAGLEWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.standalone_worker import StandaloneWorker

    from sglang_specpilot.sglang_plugin.worker import SpecPilotWorker

    algo = SpeculativeAlgorithm.from_string("specpilot")
    assert algo is SpeculativeAlgorithm.STANDALONE and algo.is_standalone()
    ours = SimpleNamespace(speculative_algorithm="SPECPILOT", disable_overlap_schedule=True)
    assert algo.create_worker(ours) is SpecPilotWorker
    assert issubclass(SpecPilotWorker, StandaloneWorker)
    # Every other algorithm is untouched.
    theirs = SimpleNamespace(speculative_algorithm="STANDALONE", disable_overlap_schedule=True)
    assert SpeculativeAlgorithm.STANDALONE.create_worker(theirs) is StandaloneWorker
    eagle = SimpleNamespace(
        speculative_algorithm="EAGLE", disable_overlap_schedule=True, enable_multi_layer_eagle=False
    )
    assert SpeculativeAlgorithm.from_string("EAGLE").create_worker(eagle) is EAGLEWorker
    with pytest.raises(ValueError):
        SpeculativeAlgorithm.from_string("specpilotx")


def test_fresh_interpreter_and_spawned_child_see_the_registration(sglang, tmp_path):
    # A throwaway venv whose site-packages holds only our .pth; PYTHONPATH lends it this process's
    # packages (sglang, torch) without their .pth files, so the hook can only come from ours.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    hook_install.install(Path(purelib))
    paths = [str(ROOT)] + [p for p in sys.path if p.endswith("-packages")] + [sysconfig.get_paths()["purelib"]]
    env = {k: v for k, v in os.environ.items() if k != "SPECPILOT_SGLANG_PLUGIN"}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    out = subprocess.run(
        [str(py), "-m", "tests.sglang_support.child_probe"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=500,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["startup"] == {"hook": True, "sglang_before": False}
    expected = {"algorithm": "specpilot", "quantization": "w12", "maps_to": "STANDALONE", "w12_config": "W12Config"}
    assert got["here"] == expected
    assert got["spawned"] == expected


# ---------------------------------------------------------------------------------------------------------
# Quantization method w12
# ---------------------------------------------------------------------------------------------------------


def _weights(g):
    """A tiny checkpoint: q/k/v (fused by SGLang into qkv_proj), o_proj and the embedding, in BF16, with
    values that must become escapes (zeros, an infinity, a far-out exponent)."""

    def w(n, k):
        t = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
        t[0, :3] = 0.0
        t[1, 1] = float("inf")
        t[2, 2] = 3.0e4
        return t

    return {
        "model.layers.0.self_attn.q_proj.weight": w(16, 24),
        "model.layers.0.self_attn.k_proj.weight": w(8, 24),
        "model.layers.0.self_attn.v_proj.weight": w(8, 24),
        "model.layers.0.self_attn.o_proj.weight": w(24, 16),
        "model.embed_tokens.weight": w(40, 24),
    }


class _Model(torch.nn.Module):
    """Just the module names and layer kinds of a Llama checkpoint's slice, with W12 linear layers."""

    def __init__(self, method):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(40, 24, dtype=torch.bfloat16)
        attn = torch.nn.Module()
        attn.qkv_proj, attn.o_proj = torch.nn.Module(), torch.nn.Module()
        method.create_weights(attn.qkv_proj, 24, [16, 8, 8], 24, 32, torch.bfloat16)
        method.create_weights(attn.o_proj, 16, [24], 16, 24, torch.bfloat16)
        layer = torch.nn.Module()
        layer.self_attn = attn
        self.model.layers = torch.nn.ModuleList([layer])

    def load_weights(self, weights):
        """What SGLang's Llama ``load_weights`` does with names: q/k/v -> qkv_proj with a shard id."""
        params = dict(self.named_parameters())
        for name, tensor in weights:
            shard = None
            for part, sid in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
                if f".{part}." in name:
                    name, shard = name.replace(part, "qkv_proj"), sid
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            elif shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)


def test_w12_method_creates_loads_and_applies(sglang, tmp_path):
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.quantization import get_quantization_config
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    from w12.codec import decode
    from w12.convert import convert

    # The checkpoint, converted by our converter.
    g = torch.Generator().manual_seed(7)
    weights = _weights(g)
    src, dst = tmp_path / "src", tmp_path / "w12"
    src.mkdir()
    save_file(weights, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps(TINY_LLAMA))
    report = convert(src, dst, verify=True, progress=False)
    assert report.escapes > 0

    cfg = get_quantization_config("w12").from_config({})
    assert cfg.get_name() == "w12" and cfg.get_scaled_act_names() == []
    method = cfg.get_quant_method(LinearBase.__new__(LinearBase), prefix="model.layers.0.self_attn.qkv_proj")
    assert type(method).__name__ == "W12LinearMethod"
    assert cfg.get_quant_method(torch.nn.Embedding(2, 2), prefix="model.embed_tokens") is None

    model = _Model(method)
    for layer in (model.model.layers[0].self_attn.qkv_proj, model.model.layers[0].self_attn.o_proj):
        layer.quant_method = method  # as LinearBase.__init__ sets it; the loader post-processes these
    # SGLang's own file iterator and loader entry point (patched to route W12 planes).
    files = sorted(str(p) for p in dst.glob("*.safetensors"))
    DefaultModelLoader.load_weights_and_postprocess(model, safetensors_weights_iterator(files), torch.device("cpu"))

    attn = model.model.layers[0].self_attn
    fused = torch.cat([weights[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    x = torch.randn(5, 24, generator=g).to(torch.bfloat16)
    bias = torch.randn(32, generator=g).to(torch.bfloat16)
    # Exact: the fused record decodes to the original bits, so apply equals an fp32 GEMM on the original
    # weight (the W12 GEMM's reference on a plain CPU; on the GPU its Triton kernel, within its tolerance).
    expected = (x.float() @ fused.float().T + bias.float()).to(torch.bfloat16)
    assert torch.equal(method.apply(attn.qkv_proj, x, bias), expected)
    assert torch.equal(decode(method.record(attn.qkv_proj)).view(torch.int16), fused.view(torch.int16))
    o = weights["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(decode(method.record(attn.o_proj)).view(torch.int16), o.view(torch.int16))
    # The embedding is not a linear layer: its record arrives decoded, bit for bit.
    emb = weights["model.embed_tokens.weight"]
    assert torch.equal(model.model.embed_tokens.weight.view(torch.int16), emb.view(torch.int16))
