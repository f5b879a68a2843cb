"""Dense bf16 peak FLOP/s of accelerators, by jax device_kind (no jax import: `cardjax plan`
reads it before jax starts, the trainer for MFU)."""

from __future__ import annotations

# Dense bf16 peak per device (no sparsity), matched against jax's device_kind, lower-cased,
# first match wins: so the longer names come first ("h100 pcie" before "h100", "l40s" before
# "l4", "a100" before "a10", "v5 lite" before "v5"). TPU v5p chips report "TPU v5" and v5e
# "TPU v5 lite"; v6e "TPU v6 lite"; a TPU device is a chip (megacore on v4/v5p).
PEAK_FLOPS = (
    ("gh200", 989e12), ("h200", 989e12), ("h100 pcie", 756e12), ("h100", 989e12),
    ("h800", 989e12), ("b200", 2250e12), ("b100", 1750e12), ("a100", 312e12),
    ("a800", 312e12), ("l40s", 362e12), ("a10", 125e12), ("l4", 121e12), ("v100", 125e12),
    ("tpu v6 lite", 918e12), ("tpu v6e", 918e12), ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12), ("tpu v5p", 459e12), ("tpu v5", 459e12), ("tpu v4", 275e12),
    ("tpu v3", 123e12), ("tpu v2", 45e12))


def peak_flops_for_kind(kind: str) -> float | None:
  """The PEAK_FLOPS entry for a device_kind; None for CPUs and unknown chips (no MFU)."""
  kind = kind.lower()
  for key, value in PEAK_FLOPS:
    if key in kind:
      return value
  return None
