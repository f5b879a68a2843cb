"""One process of the 2-process data test (run by test_data_multihost.py, not by pytest).

argv: process_id port tokenizer_dir out_json. Two CPU devices per process, gloo collectives:
the pipeline's per-host rows become one global batch on a 4-device mesh.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def main():
  process_id, port, tok_dir, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
  from jax.experimental import multihost_utils

  from cardjax.data.pipeline import DataLoader, PipelineSpec
  from cardjax.data.tokenizer import load_tokenizer
  from cardjax.parallel import make_mesh

  docs = [f"document number {i} " + "word " * (i % 7) for i in range(40)]
  source = [{"text": d.encode()} for d in docs]
  tok = load_tokenizer(tok_dir)
  mesh = make_mesh(1, -1, 1)  # 4 devices over 2 processes
  spec = PipelineSpec(seq_len=32, batch_size=4, num_epochs=1, seed=3)
  loader = DataLoader(source, tok, spec, mesh=mesh)
  local_rows, global_rows, sums = [], [], []
  summed = jax.jit(lambda t: (t * (t > 0)).sum())
  for batch in loader:
    local_rows.append(np.concatenate([np.asarray(s.data) for s in sorted(
        batch["tokens"].addressable_shards, key=lambda s: s.index[0].start or 0)]).tolist())
    global_rows.append(multihost_utils.process_allgather(batch["tokens"], tiled=True).tolist())
    sums.append(int(summed(batch["tokens"])))
  json.dump({"devices": jax.device_count(), "local": local_rows, "global": global_rows,
             "sums": sums, "shape": list(batch["tokens"].shape)}, open(out, "w"))


if __name__ == "__main__":
  main()
