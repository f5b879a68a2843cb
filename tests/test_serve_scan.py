"""`cardjax serve --scan-layers`: the served model's layers in one scanned block (auto on
accelerators, where it cuts the warm-up's compile time) give the tokens the unrolled
layers give."""

from serve_helpers import mars_run

from cardjax.serve.cli import served_scan
from cardjax.serve.engine import Engine


def test_auto_scans_on_accelerators_and_unrolls_on_a_cpu():
  assert served_scan("auto", "gpu") and served_scan("auto", "tpu")
  assert not served_scan("auto", "cpu")
  assert served_scan("on", "cpu") and not served_scan("off", "gpu")


def test_a_scanned_pool_decodes_the_unrolled_pools_tokens(tmp_path):
  run = str(mars_run(tmp_path, context=64))
  got = {}
  for scan in (False, True):
    engine = Engine.load(run, scan_layers=scan, batch_sizes=(1, 4), slots=64, chunk=4)
    assert engine.model.cfg.scan_layers == scan
    for method in ("ar", "mars"):
      pool = engine.pool(engine.settings({"method": method, "tau": 0.7}))
      prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
      pool.admit_many((i, p, 0.7, 12) for i, p in enumerate(prompts))
      tokens = {i: [] for i in range(3)}
      while pool.busy():
        for key, new in pool.step(4)[0].items():
          tokens[key] += new
      got[scan, method] = tokens
  assert got[True, "ar"] == got[False, "ar"] and got[True, "mars"] == got[False, "mars"]
  assert all(len(t) == 12 for t in got[True, "ar"].values())


def test_forwards_per_check_defaults_and_checks():
  import pytest

  from cardjax.errors import CardjaxError
  from cardjax.serve.cli import forwards_per_check

  assert forwards_per_check("auto", "gpu") == 4 and forwards_per_check("auto", "cpu") == 1
  assert forwards_per_check("2", "cpu") == 2
  with pytest.raises(CardjaxError, match="positive integer"):
    forwards_per_check("0", "gpu")
