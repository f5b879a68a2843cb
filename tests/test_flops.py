"""Peak FLOPs by device kind: every kind jax reports for the chips the recipes name; LoRA's
step count."""

import pytest

from cardjax.model import ModelConfig
from cardjax.train import flops
from cardjax.train.flops import peak_flops_for_kind


@pytest.mark.parametrize("kind,peak", [
    ("TPU v5", 459e12),            # v5p chips report "TPU v5"
    ("TPU v5p", 459e12),
    ("TPU v5 lite", 197e12),       # v5e
    ("TPU v6 lite", 918e12),       # v6e (Trillium)
    ("TPU v4", 275e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA L4", 121e12),
])
def test_peak_flops_match_each_kind(kind, peak):
  assert peak_flops_for_kind(kind) == peak


@pytest.mark.parametrize("kind", ["cpu", "Some Future Chip"])
def test_unknown_kinds_report_no_peak(kind):
  assert peak_flops_for_kind(kind) is None


def test_a_lora_step_counts_no_weight_gradients():
  """LoRA's frozen base: 4 FLOPs per matmul parameter per token instead of 6; attention
  (no weights) is the same."""
  cfg = ModelConfig()
  full = flops.train_flops_per_row(cfg, 64, 1000.0)
  lora = flops.train_flops_per_row(cfg, 64, 1000.0, frozen_base=True)
  assert full - lora == 2.0 * flops.matmul_params(cfg) * 64
