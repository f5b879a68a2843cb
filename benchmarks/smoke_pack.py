"""A bench pack in seconds, for the CPU smoke run of the prepared GPU call: the decode
benchmark's four runs (sft, mars, ar, card) with random weights in a toy width, and its
prompt sets, laid out as `make bench-pack` lays out the trained ones.

  python -m benchmarks.smoke_pack OUT

The datasets (arith_sft, python_stdlib) are built under OUT/data for their tokenizers and
prompts. The weights are drawn with initializer_range 1.0: peaked random logits, so MARS at
tau < 1 accepts runs of tokens as a trained model does. Nothing here is a figure: the pack
exists so that benchmarks/decode_device.py's code runs where no trained pack is.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import arg_parser

SMALL = ["--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.model.num_layers=1", "--config.model.num_heads=2",
         "--config.model.num_kv_heads=1", "--config.model.initializer_range=1.0"]


def build(out: Path) -> Path:
  from cardjax import checkpoint
  from cardjax.config import load_config, model_config
  from cardjax.data.prepare import prepare, tokenizer_source
  from cardjax.eval import suite
  from cardjax.model import create_model

  from benchmarks.decode import PROMPT_LEN

  for name in ("sft", "mars", "ar", "card"):
    config = load_config(f"configs/decode_bench.py:{name}",
                         [f"--config.data.data_dir={out / 'data'}", *SMALL])
    prepare(config)
    root = out / "runs" / name / "checkpoints"
    checkpoint.save_model(root, create_model(model_config(config), seed=0), step=0,
                          run_config=config)
    checkpoint.copy_assets(root, tokenizer_source(config))
  sft, ar = (suite.load_run(out / "runs" / n) for n in ("sft", "ar"))
  sets = {"arith": suite.arith_inputs(sft, 8), "code": suite.code_inputs(ar, 4, PROMPT_LEN)}
  (out / "inputs.json").write_text(json.dumps(sets) + "\n")
  return out


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("out", type=Path)
  build(parser.parse_args().out)


if __name__ == "__main__":
  main()
