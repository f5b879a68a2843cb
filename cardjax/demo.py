"""`make demo`: the main job in miniature, on CPU, with every artefact under one folder.

So far the job is the model round trip the rest of cardjax stands on: random-init the tiny
config, save an orbax checkpoint, export it as a Hugging Face folder, load that folder back
into cardjax and (when installed) into transformers, and compare the logits. Later stages
(data, training, decoding) extend this file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def _stage(name: str):
  print(f"== {name}", flush=True)
  return time.time()


def run_demo(workdir: str | Path, overrides=()) -> dict:
  from cardjax import checkpoint, hf
  from cardjax.config import load_config, model_config
  from cardjax.model import create_model, param_count

  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  report: dict = {"jax": jax.__version__, "backend": jax.default_backend()}

  t = _stage("1/4 init the tiny model (configs/tiny.py)")
  config = load_config("configs/tiny.py", overrides)
  cfg = model_config(config)
  model = create_model(cfg, seed=config.seed)
  report["params"] = param_count(model)
  print(f"   {report['params']:,} parameters, {cfg.num_layers} layers, vocab {cfg.vocab_size}"
        f" ({time.time() - t:.1f}s)")

  t = _stage("2/4 save and restore an orbax checkpoint")
  ckpt = checkpoint.save_model(workdir / "checkpoints", model, step=0)
  restored, _ = checkpoint.restore_model(ckpt)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 32)), jnp.int32)
  logits = np.asarray(model(tokens))
  report["orbax_max_abs_diff"] = float(np.abs(np.asarray(restored(tokens)) - logits).max())
  print(f"   {ckpt}: restored logits differ by {report['orbax_max_abs_diff']:.2e} "
        f"({time.time() - t:.1f}s)")

  t = _stage("3/4 export to Hugging Face and import back")
  hf_dir = hf.save_pretrained(restored, workdir / "hf")
  reimported = hf.from_pretrained(hf_dir)
  report["hf_roundtrip_max_abs_diff"] = float(
      np.abs(np.asarray(reimported(tokens)) - logits).max())
  print(f"   {hf_dir}: re-imported logits differ by {report['hf_roundtrip_max_abs_diff']:.2e}"
        f" ({time.time() - t:.1f}s)")

  t = _stage("4/4 load the export in transformers")
  try:
    import torch
    import transformers
  except ImportError:
    print("   transformers/torch not installed; skipped (pip install -e '.[test]')")
  else:
    tm = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
      ref = tm.eval()(torch.tensor(np.asarray(tokens))).logits.numpy()
    report["transformers_max_abs_diff"] = float(np.abs(ref - logits).max())
    print(f"   transformers {transformers.__version__} logits differ by "
          f"{report['transformers_max_abs_diff']:.2e} ({time.time() - t:.1f}s)")

  (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
  print(f"== done: {workdir / 'report.json'}")
  return report
