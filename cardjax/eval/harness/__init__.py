"""lm-eval-harness on cardjax checkpoints: the `cardjax` model of `lm_eval` and the
`cardjax eval --harness` runner (docs/evaluation.md).

- model.py: CardjaxLM, lm-eval's LM API over a loaded run;
- settings.py: lm-eval's model_args as cardjax's decoding Options;
- loglik.py: loglikelihood / loglikelihood_rolling in AR order, one jitted forward a batch;
- elbo.py: the same requests for MDLM and BD3LM checkpoints, a Monte Carlo ELBO estimate;
- generating.py: generate_until through the checkpoint's decoder (make_decoder);
- metrics.py: the decoding metrics each task gets in the results JSON;
- runner.py: simple_evaluate, the table and the JSON of `cardjax eval --harness`;
- documents.py and tasks/: the shipped local tasks (arith_sft, arith_mc), offline.
lm_eval is imported only here, never by the rest of cardjax (the `eval` extra).
"""
