"""cardjax's benchmarks: scripts that measure and print tables, run from the repo root.

  python -m benchmarks.decode --help        # any benchmark: python -m benchmarks.NAME
  python -m benchmarks.studies.NAME --help  # a one-off study

Maintained benchmarks (a Makefile target or a shell script here runs them):
- decode: every decoding method against AR with a KV cache (`make bench-decode`);
- check: re-runs a small decode benchmark against results/decode/bench_check.json
  (`make bench-check`), judged by recorded.py;
- pack_runs: the trained runs decode.py reads, packed for another machine (`make bench-pack`);
- real_model: SmolLM2-135M-Instruct end to end (`make bench-real`);
- serve: the load test of `cardjax serve` (serve_gpu.sh);
- attention, attention_decode: the Pallas attention kernels (attention_gpu.sh);
- decode_forward, data, train_step: one cached forward, the data pipeline, a train step.

studies/ holds one-off studies that docs/ cite for a finding (seed spread of a recipe,
paired timing, CPU matmuls, an MDLM context probe): kept runnable, not kept current.
common.py holds what several of them share: the "mean [range]" cell, the seed run folders,
the median timing, a printed-and-saved report, matplotlib and the machine line.
The shell scripts (decode_offline.sh, attention_gpu.sh, serve_gpu.sh, real_model_train.sh)
cd to the repo root themselves.
"""
