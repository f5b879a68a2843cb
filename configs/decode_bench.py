"""The models benchmarks/decode.py compares: one small recipe per objective.

`--config configs/decode_bench.py:NAME` with NAME one of
  sft        AR SFT on arith_sft (stage 1 of the MARS recipe and the AR baseline)
  mars       MARS on arith_sft, started from the sft run (train.init_from, set by the bench)
  ar         AR pretraining on python_stdlib (the code baseline and the NLL judge)
  card       CARD on python_stdlib (soft tail, context reweighting, clean_fraction 0)
  card_half  the same with half the rows left clean (clean_fraction 0.5)
  mdlm       MDLM on python_stdlib (bidirectional; the family DUS/EB/CB target): Dream-style
             shifted outputs, stratified t, 32 rows a step (the recipe that reads its
             context, docs/reproducibility.md)
  mdlm_a2d   the same recipe started from the ar run's weights (the AR-to-diffusion route of
             Dream and dllm's A2D), 1000 steps at lr 1e-3; train.init_from: the bench sets
             the same seed's ar run, and alone it reads runs/bench_decode/runs/ar
  mdlm_readmes  the same recipe on a second corpus: the package descriptions (README text,
             mostly English prose and markdown) in the METADATA files of the running
             interpreter's installed distributions, 10% held out

The model is the tiny config widened to 128 x 4 layers: big enough to solve a share of the
arithmetic problems after minutes of CPU training, small enough to decode on CPU.
"""

import sysconfig

from cardjax.config import load_config

BASES = {"sft": "tiny_sft", "mars": "tiny_mars", "ar": "tiny_ar", "card": "tiny_card",
         "card_half": "tiny_card", "mdlm": "tiny_mdlm", "mdlm_a2d": "tiny_mdlm",
         "mdlm_readmes": "tiny_mdlm"}
STEPS = {"sft": 4000, "mars": 1000, "ar": 2400, "card": 2400, "card_half": 2400, "mdlm": 2000,
         "mdlm_a2d": 1000, "mdlm_readmes": 2000}
# Checkpoints kept along the way, so benchmarks/code_spread.py and mdlm_context.py
# --every-step can show whether a code recipe has settled (the newest 3 are kept; mdlm 4).
CHECKPOINTS = {"ar": 800, "card": 800, "card_half": 800, "mdlm": 500, "mdlm_a2d": 250,
               "mdlm_readmes": 500}


def get_config(name: str = "sft"):
  if name not in BASES:
    raise ValueError(f"decode_bench: unknown model {name!r}; choose one of {sorted(BASES)}")
  c = load_config(BASES[name])
  c.name = f"decode_bench_{name}"
  c.model.hidden_size = 128
  c.model.intermediate_size = 384
  c.model.num_layers = 4
  c.data.batch_size = 16
  c.train.steps = STEPS[name]
  c.train.warmup_steps = 50
  c.train.eval_every = 0
  c.train.checkpoint_every = CHECKPOINTS.get(name, STEPS[name])
  if name in ("mars", "mdlm_a2d"):
    c.train.lr = 1e-3  # fine-tuning a trained model: a gentler rate than from scratch
  if name == "mars":
    # The compact noisy stream: the same loss and gradients for 0.81x the tokens. Every
    # arith_sft row needs at most 0.5625 of its 128 tokens (all 20000 rows read by
    # benchmarks.studies.mars_step's needed_share); a model trained so decodes inside the
    # recorded spread of the full copy's (docs/objectives.md).
    c.objective.noisy_fraction = 0.625
  if name == "card_half":
    c.objective.clean_fraction = 0.5
  if name.startswith("mdlm"):
    mdlm_recipe(c)
    c.train.keep_checkpoints = 4
  if name == "mdlm_a2d":
    # Never a silent random init: the seed-0 AR run of benchmarks/decode.py's default
    # workdir unless the bench (or --config.train.init_from) names another.
    c.train.init_from = "runs/bench_decode/runs/ar/checkpoints"
  if name == "mdlm_readmes":
    c.data.dataset = "text_corpus"
    c.data.options = {"paths": (sysconfig.get_paths()["purelib"] + "/*.dist-info/METADATA",),
                      "validation_percent": 10}
  return c


def mdlm_recipe(c):
  """The MDLM settings that read context, applied to config `c` (also by the tiny test of
  tests/test_mdlm_recipe.py). The unshifted recipe never read its context: masked CE flat
  in t at the unigram level after 2000 steps, and flat again at 600 steps with lr 1e-3, with
  32 rows and with stratified t. With shifted outputs (Dream style) the position that
  predicts a masked token holds its visible left neighbour, as in an AR model, and the CE
  falls with t from the first few hundred steps. 32 rows a step reach what 16 rows reach in
  twice the steps (the CE follows the tokens seen), in about the same time on 2 cores; the
  stratified t draw (the MDLM paper's sampler) neither helped nor hurt at 600 steps
  (docs/reproducibility.md)."""
  c.objective.shift = True
  c.objective.t_draw = "stratified"
  c.data.batch_size = 32
  return c
