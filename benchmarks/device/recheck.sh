# After tune_runs.sh D (the GGUF in /tmp, the machine still warm), the figures the freed split-K buffer
# (c6d1d99) may have held down, and one diagnosis:
#   bash benchmarks/device/recheck.sh rounds    # the rounds suite's real SmolLM2 part; the TMA numerics probe
#   bash benchmarks/device/recheck.sh batched   # lifted 8B server, 16 clients x 4 requests: AR vs the mechanisms
#   bash benchmarks/device/recheck.sh packed [ab]  # the same (and stock) with the packed prefill; "ab": then
#                                               # off too (SPECPILOT_PACKED_PREFILL=0); through serve_loop_probe
#   NS=1,4,16,64 bash benchmarks/device/recheck.sh sweep  # the same over N (SWEEP_S: the call's seconds;
#       EXTRA: more bench batched arguments, e.g. "--resume benchmarks/results/batched_h100.json" to add
#       N = 4, 8, 32, 64 to the N = 1 and 16 of d6fbe2c, or "--shared-budget 64" for 4 nodes a row at 16)
set -u
export PYTHONPATH=$PWD:/tmp/pp
stage=${1:?stage rounds, batched or packed}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
case "$stage" in
rounds)
  timeout 200 python -m sglang_specpilot.cli bench rounds --parts real --model /tmp/smol.gguf --gamma 6 \
    --results-dir $OUT/rounds 2>&1 | grep -v Warn | tail -6
  timeout 120 python benchmarks/probes/tma_numerics_probe.py 2>&1 | tail -24 ;;
batched)
  timeout 560 python -m sglang_specpilot.cli bench batched --model /tmp/smol.gguf --systems ar,specpilot_batched \
    --concurrency 16 --requests-per-client 4 --deadline-s 500 --results-dir $OUT/batched 2>&1 | grep -v Warn | tail -16 ;;
packed)  # packed prefill on (the default); with a second argument "ab", then off as well
  for v in 1 ${2:+0}; do
    systems=ar,specpilot_batched; [ $v = 1 ] && systems=${SYSTEMS:-ar,stock,specpilot_batched}
    SPECPILOT_PACKED_PREFILL=$v timeout 280 python benchmarks/probes/serve_loop_probe.py -- --model /tmp/smol.gguf \
      --systems $systems --concurrency 16 --requests-per-client 4 --deadline-s 250 --results-dir $OUT/packed$v 2>&1 \
      | grep -v -E "Warn|pdl|originates|warn_once|^ *$|_warn_once|return PDL" | tail -16
    mv $OUT/serve_loop_probe.json $OUT/packed$v/serve_loop_probe.json
  done ;;
sweep)  # the issue-18 sweep over N (default 1,4,16,64) through serve_loop_probe: AR, stock, the mechanisms
  timeout ${SWEEP_S:-540} python benchmarks/probes/serve_loop_probe.py -- --model /tmp/smol.gguf \
    --systems ${SYSTEMS:-ar,stock,specpilot_batched} --concurrency ${NS:-1,4,16,64} --requests-per-client 4 \
    --deadline-s $(( ${SWEEP_S:-540} - 80 )) --results-dir $OUT/sweep ${EXTRA:-} 2>&1 \
    | grep -v -E "Warn|pdl|originates|warn_once|^ *$|_warn_once|return PDL" | tail -60
  mv $OUT/serve_loop_probe.json $OUT/sweep/serve_loop_probe.json ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
