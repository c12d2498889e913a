"""Convert a checkpoint to W12 (lossless 12-bit weights), verify it, and generate from it.

    python examples/convert_w12.py                       # the embedded SmolLM2 GGUF -> ./smollm2-w12
    python examples/convert_w12.py path/to/hf_folder out_w12/

On a GPU, run the converted folder with `--weights w12` (`specpilot generate --model out_w12 --weights w12`)
to keep the weights 12-bit in memory and decode them inside the GEMM. Here it is loaded with BF16 weights,
which the loader decodes bit for bit from the W12 planes.
"""

import argparse

from sglang_specpilot import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.models.loader import default_model_path
from w12 import verify_w12_folder
from w12.convert import convert


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", nargs="?", help="GGUF file or HF safetensors folder (default: the embedded SmolLM2)")
    p.add_argument("dst", nargs="?", default="smollm2-w12")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--prompt", default="The capital of France is")
    args = p.parse_args()

    src = args.src or str(default_model_path())
    report = convert(src, args.dst, verify=True, force=True, progress=False)  # verify: bit-exact vs the source
    print(report.summary())
    problems = verify_w12_folder(args.dst)  # what `specpilot w12 verify DST` runs: hashes, manifest, side files
    print(f"verify: {'good' if not problems else problems}")
    engine = Engine.from_options(EngineOptions(model=args.dst, device="cpu"))
    result = engine.generate(args.prompt, SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True))[0]
    print(f"{args.prompt!r} -> {result.text!r}")


if __name__ == "__main__":
    main()
