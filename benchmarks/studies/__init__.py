"""One-off studies behind findings in docs/: run as `python -m benchmarks.studies.NAME`.

- recipe_spread: how far an arith recipe's exact match moves with its training seed;
- code_spread: the same for the code recipes, grading decode.py's checkpoints;
- mdlm_context: whether an MDLM checkpoint reads its context (masked CE by mask rate);
- cpu_matmul: a few-token forward's matmuls under each XLA:CPU matmul library;
- paired_timing: AR and MARS timed in alternation, a speedup VM drift cannot fake.

They are kept runnable (their docs cite their commands) but not extended: a study that
becomes a regular measurement moves up to benchmarks/ with a Makefile target.
"""
