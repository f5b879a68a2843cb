"""A tiny MARS-run checkpoint and a `cardjax serve` subprocess on a free loopback port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import orbax.checkpoint as ocp
import portpicker
from flax import nnx

from launch_helpers import one_device_flags

from cardjax import checkpoint
from cardjax.config import base_config
from cardjax.data.tokenizer import train_bpe
from cardjax.model import ModelConfig, create_model
from cardjax.serve.metrics import scrape

TEXTS = ["alpha beta gamma delta epsilon", "one two three four five six"] * 20


def mars_run(root, block: int = 4, context: int = 128):
  """A checkpoint as a MARS training run saves it (objective mars, block_size B), random
  weights with initializer_range 0.3: peaked logits, so greedy paths are far from ties."""
  tok = train_bpe(TEXTS, 300, root / "tok")
  model = create_model(ModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64,
                                   num_layers=2, num_heads=4, num_kv_heads=2,
                                   initializer_range=0.3, max_position_embeddings=context,
                                   mask_token_id=tok.mask_id, eos_token_id=tok.eos_id),
                       seed=3)
  return save_mars_run(model, block, root / "run", root / "tok")


def save_mars_run(model, block: int, run, tokenizer_dir):
  """`model` saved in `run`/checkpoints as a MARS training run saves it (params, model
  config, a run config with objective mars and block_size), with the tokenizer's files:
  no training needed to read its settings. Returns `run`."""
  return save_run(model, run, tokenizer_dir, "mars", block_size=block)


def save_run(model, run, tokenizer_dir, objective: str, **settings):
  """`model` saved in `run`/checkpoints as a training run of `objective` saves it, its
  run config's objective section given `settings`, with the tokenizer's files. Returns
  `run`."""
  config = base_config()
  config.objective.name = objective
  for key, value in settings.items():
    setattr(config.objective, key, value)
  ckpt = run / "checkpoints"
  with checkpoint.manager(ckpt) as mngr:
    mngr.save(0, args=ocp.args.Composite(
        params=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(model, nnx.Param))),
        model_config=ocp.args.JsonSave(model.cfg.to_dict()),
        config=ocp.args.JsonSave(config.to_dict())))
    mngr.wait_until_finished()
  checkpoint.copy_assets(ckpt, tokenizer_dir)
  return run


def server_env() -> dict:
  """The test environment less conftest's 8 simulated devices: the server decodes on one."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = one_device_flags(env.get("XLA_FLAGS", ""))
  return env


def start_server(run, *args: str, timeout: float = 180.0):
  """(process, base url) of `cardjax serve` on `run`, once /health answers. Without a
  warm-up unless `args` ask for one: the tests that count compiles ask."""
  port = portpicker.pick_unused_port()
  if "--warmup-width" not in args:
    args += ("--warmup-width", "0")
  proc = subprocess.Popen([sys.executable, "-m", "cardjax.cli", "serve", "--checkpoint",
                           str(run), "--port", str(port), *args], env=server_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  url = f"http://127.0.0.1:{port}"
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"cardjax serve exited with {proc.returncode}:\n{proc.stdout.read()}")
    try:
      with urllib.request.urlopen(url + "/health", timeout=1) as r:
        if r.status == 200:
          return proc, url
    except OSError:
      time.sleep(0.3)
  proc.kill()
  raise RuntimeError(f"cardjax serve did not answer within {timeout}s:\n{proc.stdout.read()}")


def metric(url: str, name: str) -> float:
  """A sample's value from /metrics (name with its labels, as Prometheus prints it)."""
  return scrape(url).get(name, 0.0)


def post(url: str, body, route: str = "/v1/completions", key: str | None = None,
         timeout: float = 120):
  """(status, JSON answer, headers) of a POST of `body` (a dict, or raw bytes) to `route`,
  with `Authorization: Bearer key` when a key is given; 4xx/5xx answers are returned too."""
  data = body if isinstance(body, bytes) else json.dumps(body).encode()
  headers = {"Content-Type": "application/json"}
  if key is not None:
    headers["Authorization"] = f"Bearer {key}"
  request = urllib.request.Request(url + route, data=data, headers=headers)
  try:
    with urllib.request.urlopen(request, timeout=timeout) as r:
      return r.status, json.loads(r.read()), r.headers
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read()), e.headers
