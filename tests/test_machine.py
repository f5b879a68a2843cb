"""The machine line every benchmark prints: cores usable by the process are part of it."""

from cardjax import machine


def test_describe_records_the_usable_cores_and_xla_flags(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  info = machine.describe()
  assert 1 <= info["usable_cores"] <= info["cores"]
  assert info["xla_flags"] == "--xla_cpu_multi_thread_eigen=false"


def test_line_names_a_narrower_core_mask():
  info = {"cpu": "AMD EPYC", "cpu_flags": ["avx2"], "cores": 2, "usable_cores": 1,
          "device": "cpu:cpu", "jax": "0.10.2", "commit": "abc", "date": "d"}
  assert "2 cores (1 usable)," in machine.line(info)
  info["usable_cores"] = 2
  assert "2 cores," in machine.line(info) and "usable" not in machine.line(info)
  del info["usable_cores"]  # a results file written before the field existed
  assert "2 cores," in machine.line(info)
