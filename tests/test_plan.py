"""`cardjax plan`: target names, and the real train step compiled for a compile-only TPU
slice (libtpu) and for 8 simulated GPU devices, with no weights allocated."""

import json

import pytest

from cardjax.cli import main
from cardjax.config import load_config
from cardjax.errors import CardjaxError
from cardjax.plan import accum_choices, report, run_plan
from cardjax.plan.targets import parse_target

TINY = ["--config.model.num_layers=2", "--config.model.hidden_size=64",
        "--config.data.batch_size=16", "--config.data.seq_len=64"]


@pytest.mark.parametrize("name,chips,topology", [
    ("v5p-8", 4, "v5:2x2x1"), ("v5p-64", 32, "v5:2x4x4"), ("v5p-128", 64, "v5:4x4x4"),
    ("v5e-16", 16, "v5e:4x4"), ("v5litepod-4", 4, "v5e:2x2"), ("v6e-8", 8, "v6e:2x4"),
    ("v4-32", 16, "v4:2x2x4"), ("8xH200", 8, ""), ("16xH100", 16, "")])
def test_target_names(name, chips, topology):
  t = parse_target(name)
  assert (t.chips, t.libtpu_topology) == (chips, topology)


@pytest.mark.parametrize("name,needle", [
    ("v7x-8", "unknown TPU generation"), ("8xB300", "unknown GPU"), ("v5p-7", "even"),
    ("v5e-12", "power-of-two"), ("tpu", "not a TPU slice")])
def test_bad_target_names(name, needle):
  with pytest.raises(CardjaxError, match=needle):
    parse_target(name)


def test_plan_on_a_compile_only_tpu_slice():
  """v5p-8: 4 compile-only v5p chips from libtpu; the tiny step fits with its shards."""
  config = load_config("configs/tiny_mars.py", TINY)
  plans = run_plan(config, "v5p-8")
  assert len(plans) == 1 and plans[0].fits and plans[0].mesh["fsdp"] == 4
  p = plans[0]
  assert 0 < p.params < p.opt_state < p.total < p.hbm == 95 << 30
  text = report(config, plans, 0.4)
  assert "v5:2x2x1" in text and "fits" in text and "budget:" in text


def test_plan_on_8_simulated_gpus_searches_grad_accum(tmp_path, capsys):
  """A device 'memory' too small for the step: the plan compiles with more micro-batches
  until one fits and exits 3 naming it; the temporaries fall as grad_accum grows."""
  config = load_config("configs/tiny_ar.py", TINY)
  big = run_plan(config, "8xH200")[0]
  assert big.fits and big.mesh["fsdp"] == 8
  import cardjax.plan.targets as targets
  hbm = targets.GPUS["H200"]
  try:  # shrink the device until only a smaller micro-batch fits
    targets.GPUS["H200"] = int(big.total * 0.8)
    plans = run_plan(config, "8xH200")
    assert not plans[0].fits and plans[-1].fits and plans[-1].grad_accum == 2
    assert plans[-1].temp < plans[0].temp
    out = tmp_path / "plan.json"
    code = main(["plan", "--config", "configs/tiny_ar.py", *TINY, "--topology", "8xH200",
                 "--json", str(out)])
  finally:
    targets.GPUS["H200"] = hbm
  assert code == 3 and "--config.train.grad_accum=2" in capsys.readouterr().out
  assert json.loads(out.read_text())["plans"][-1]["grad_accum"] == 2


def test_multi_slice_plan_lays_the_data_axis_across_slices():
  """2xv5p-8: two compile-only slices of 4 chips; the mesh's data axis is the slice axis
  (each data row of the device grid is one slice), fsdp stays inside a slice."""
  from cardjax.parallel import make_mesh
  from cardjax.plan.targets import target_devices

  target = parse_target("2xv5p-8")
  assert (target.chips, target.slices, target.libtpu_topology) == (8, 2, "v5:2x2x1")
  devices = target_devices(target)
  mesh = make_mesh(2, -1, 1, devices=devices, slices=2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
  for row, grid in enumerate(mesh.devices):
    assert {d.slice_index for d in grid.flat} == {row}
  with pytest.raises(CardjaxError, match="multiple of mesh.slices=2"):
    make_mesh(1, -1, 1, devices=devices, slices=2)
  config = load_config("configs/tiny_ar.py", TINY)
  plan = run_plan(config, "2xv5p-8")[-1]
  assert plan.fits and plan.mesh == {"data": 2, "fsdp": 4, "tensor": 1}


def test_accum_choices_keep_the_micro_batch_divisible():
  config = load_config("configs/tiny_ar.py", ["--config.data.batch_size=16"])
  assert accum_choices(config, 8) == [2]
  assert accum_choices(config, 1) == [2, 4, 8, 16]


@pytest.mark.parametrize("extra,needle", [
    (["--topology", "v9-8"], "unknown TPU generation 'v9'"),
    (["--topology", "8xH200", "--config.mesh.tensor=3"], "8 devices are not divisible by 3"),
])
def test_plan_bad_input_is_one_line_exit_2(extra, needle, capsys):
  assert main(["plan", "--config", "configs/tiny_ar.py", *TINY, *extra]) == 2
  assert needle in capsys.readouterr().err


def test_a_recipe_that_fits_nowhere_exits_1_with_the_numbers(capsys):
  import cardjax.plan.targets as targets
  hbm = targets.GPUS["H200"]
  try:
    targets.GPUS["H200"] = 1 << 20  # 1 MiB devices: not even the state fits
    code = main(["plan", "--config", "configs/tiny_ar.py", *TINY, "--topology", "8xH200"])
  finally:
    targets.GPUS["H200"] = hbm
  out = capsys.readouterr().out
  assert code == 1 and "does not fit with any grad_accum tried" in out and "MiB" in out


def test_a_lora_plan_holds_optimizer_state_for_the_adapters_only():
  """train.lora: the optimizer state is the adapters' (a few percent of full fine-tuning's),
  the weights are the frozen base plus the adapters, and base_dtype bfloat16 halves the
  base."""
  full = run_plan(load_config("configs/tiny_mars.py", TINY), "v5p-8")[0]
  lora_args = [*TINY, "--config.train.lora.rank=2", "--config.train.init_from=runs/base"]
  lora = run_plan(load_config("configs/tiny_mars.py", lora_args), "v5p-8")[0]
  half = run_plan(load_config("configs/tiny_mars.py",
                              [*lora_args, "--config.train.lora.base_dtype=bfloat16"]),
                  "v5p-8")[0]
  assert lora.fits and lora.opt_state < 0.15 * full.opt_state
  assert full.params < lora.params < 1.2 * full.params
  assert half.params < 0.6 * lora.params and half.opt_state == lora.opt_state
