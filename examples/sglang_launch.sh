#!/usr/bin/env bash
# The documented SGLang commands (README "SGLang"): install the start-up hook, then launch SGLang with the
# `specpilot` speculative algorithm, and with a W12 checkpoint. Needs a GPU and SGLang 0.5.x in this
# environment (pip install "sglang==0.5.10.post1"); nothing here was run on a GPU by this project.
#
#   TARGET=meta-llama/Llama-3.1-8B-Instruct DRAFT=meta-llama/Llama-3.2-1B-Instruct bash examples/sglang_launch.sh
#   DRY_RUN=1 bash examples/sglang_launch.sh     # print the commands instead of running them
set -euo pipefail

TARGET=${TARGET:-meta-llama/Llama-3.1-8B-Instruct}
DRAFT=${DRAFT:-meta-llama/Llama-3.2-1B-Instruct}
W12_DIR=${W12_DIR:-./llama-w12}
MODE=${MODE:-spec}   # spec: speculative decoding with specpilot trees; w12: serve a W12 checkpoint

run() {
  if [[ "${DRY_RUN:-0}" == "1" ]]; then echo "+ $*"; else "$@"; fi
}

run specpilot sglang-hook install   # a .pth file in site-packages; `uninstall` removes it
run specpilot sglang-hook status    # SPECPILOT_SGLANG_PLUGIN=0 disables the hook for one run

if [[ "$MODE" == "spec" ]]; then
  run python -m sglang.launch_server --model-path "$TARGET" \
    --speculative-algorithm specpilot --speculative-draft-model-path "$DRAFT" \
    --speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8 \
    --attention-backend flashinfer
else
  run specpilot w12 convert "$TARGET" "$W12_DIR" --verify   # TARGET: a local HF safetensors folder here
  run python -m sglang.launch_server --model-path "$W12_DIR" --quantization w12 --tp-size 1
fi
