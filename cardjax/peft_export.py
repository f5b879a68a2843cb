"""`cardjax export-hf --lora peft`: a LoRA run's checkpoint as a PEFT adapter folder.

The adapter alone is useless without a base that transformers can load, so the base is
written too (as an ordinary HF folder) when asked, or when the run's base is a cardjax
checkpoint that transformers cannot read; a HF-folder base is only named in
adapter_config.json's base_model_name_or_path.
"""

from __future__ import annotations

from pathlib import Path

import jax

from cardjax import checkpoint, hf
from cardjax.errors import CheckpointError
from cardjax.hf.peft import write_adapter
from cardjax.model.lora_spec import LoraSpec
from cardjax.storage import checked_path, resolve
from cardjax.storage.transfer import cached_copy, local_output


def export_run(checkpoint_dir: str, out: str, step: int | None = None,
               lora_base: str | None = None, base_out: str | None = None,
               dtype: str | None = None, mesh=None,
               max_shard_bytes: int = 5 * 2**30) -> tuple[str, str, bool]:
  """Write step `step` (default latest) of the LoRA run at `checkpoint_dir` as a PEFT
  adapter folder at `out`. Returns (adapter folder, its base_model_name_or_path, whether
  the base was written)."""
  directory = checkpoint.readable_dir(checkpoint_dir, step)
  step = checkpoint.latest_step(directory) if step is None else step
  if not (directory / str(step) / "lora").exists():
    raise CheckpointError(f"{checkpoint_dir} step {step} is not a LoRA run's checkpoint: "
                          "--lora peft writes a LoRA run's adapters; export a full model "
                          "without it")
  record = checkpoint.lora_record(directory, step)  # the spec and the base's path
  spec = LoraSpec.from_dict(record)
  base = checkpoint.base_of_lora(checkpoint_dir, step, record, lora_base)
  assets = f"{resolve(checkpoint_dir)}/{checkpoint.ASSETS}"
  assets = assets if checked_path(assets).is_dir() else None
  base_is_hf = (checked_path(base) / "config.json").is_file()
  if base_out is None and not base_is_hf:
    base_out = f"{resolve(out)}/base"  # transformers reads HF folders only
  if base_out is not None:
    model, _ = checkpoint.load_model(base, mesh=mesh)
    base = str(hf.save_pretrained(model, base_out, dtype=dtype, assets_from=assets,
                                  max_shard_bytes=max_shard_bytes))
    del model
  cfg = checkpoint.read_model_config(directory, step)
  adapters = checkpoint.checkpoint_adapters(directory, step)  # on one device
  if jax.process_index() == 0:
    with local_output(out) as local:
      write_adapter(local, adapters, cfg, spec, base, dtype)
      if assets is not None:  # AutoTokenizer.from_pretrained(adapter folder) then works
        for f in hf.asset_files(cached_copy(assets)):
          (Path(local) / f.name).write_bytes(f.read_bytes())
  return resolve(out), base, base_out is not None
