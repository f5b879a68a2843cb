"""Evaluation: everything that scores a checkpoint or compares decoders on a dataset.

It sits above cardjax/decoding/ (samplers on token arrays) and reads datasets
(cardjax/data/) and checkpoints (cardjax/restore.py) for it:
- measure: timing (tokens per forward, tokens/s without compile), exact match, judge NLL;
- inputs: the arith_sft and python_stdlib prompt sets as token ids;
- suite: the decode comparison of benchmarks/decode.py and the demo;
- nll, generation, answers, jsonl, tasks, report, cli: `cardjax eval` (docs/evaluation.md).
Importing the package imports nothing: `cardjax --help` stays free of jax.
"""
