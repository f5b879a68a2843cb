"""benchmarks/data.py's plan section: hosts per topology, the plan's tokens/s split per
host, the workers-needed arithmetic, and a tiny run of the supply measurement (no speed
is asserted: it depends on the machine)."""

import math
import re

import pytest

from benchmarks import data as bench
from cardjax.config import load_config
from cardjax.plan import Plan, report
from cardjax.plan.targets import parse_target

TINY = ["--config.model.num_layers=2", "--config.model.hidden_size=64",
        "--config.model.intermediate_size=128", "--config.model.num_heads=2",
        "--config.model.num_kv_heads=2", "--config.data.seq_len=64",
        "--config.data.batch_size=8", "--config.data.shards=0"]  # (the recipe's 64 > 8 rows)


@pytest.mark.parametrize("name,hosts", [
    ("v5p-128", 16), ("v5p-8", 1), ("2xv5p-64", 16), ("v4-32", 4), ("v5e-16", 4),
    ("v6e-8", 1), ("8xH200", 1), ("16xH100", 2)])
def test_hosts_of_a_topology(name, hosts):
  assert bench.hosts_of(parse_target(name)) == hosts


@pytest.mark.parametrize("topology", ["v5p-128", "8xH200"])
def test_host_demand_is_the_plans_tokens_per_s_split_over_hosts(topology):
  config = load_config(bench.RECIPE, [])
  flops = 1.388e16
  d = bench.host_demand(config, topology, 0.4, flops)
  # The tokens/s `cardjax plan` prints for the same FLOPs.
  text = report(config, [Plan(parse_target(topology), 1, True, flops_per_step=flops)], 0.4)
  printed = float(re.search(r"([\d,]+) tokens/s", text).group(1).replace(",", ""))
  assert d["tokens_per_s"] == pytest.approx(printed, abs=1)
  assert d["tokens_per_s_per_host"] * d["hosts"] == pytest.approx(d["tokens_per_s"])
  assert d["rows_per_host"] * d["hosts"] == config.data.batch_size
  t = parse_target(topology)
  assert d["step_s"] == pytest.approx(flops / (t.peak_per_chip * t.chips * 0.4))


@pytest.mark.parametrize("demand,per_worker,headroom,want", [
    (100.0, 30.0, 1.5, 5), (100.0, 50.0, 1.5, 3), (100.0, 150.0, 1.5, 1),
    (100.0, 1000.0, 1.5, 1), (100.0, 25.0, 1.0, 4)])
def test_workers_needed(demand, per_worker, headroom, want):
  assert bench.workers_needed(demand, per_worker, headroom) == want
  assert want == max(1, math.ceil(headroom * demand / per_worker))


def test_needs_and_tables_from_given_rows():
  demands = [{"topology": "a", "chips": 64, "chip": "v5p", "hosts": 16, "flops_per_step": 1e16,
              "step_s": 1.0, "tokens_per_s": 1_600_000, "tokens_per_s_per_host": 100_000},
             {"topology": "b", "chips": 8, "chip": "H200", "hosts": 1, "flops_per_step": 1e16,
              "step_s": 1.0, "tokens_per_s": 400_000, "tokens_per_s_per_host": 400_000}]
  supplies = [{"hosts": h, "workers": w, "rows": r, "seq": 8, "median": m, "min": m - 10_000,
               "max": m + 10_000, "per_cpu_s": [m / w, 2 * m / w], "load_average": 1.0}
              for h, r in ((16, 4), (1, 64)) for w, m in ((1, 200_000), (2, 350_000))]
  need = bench.needs(demands, supplies, 1.5)
  # a: 1.5 x 100k / 200k -> 1; b: 1.5 x 400k / 200k = 3 (190k-210k one worker: 3-4).
  assert [n["workers_needed"] for n in need] == [1, 3]
  assert need[1]["workers_needed_range"] == [3, 4]
  # By CPU time: one worker's median of 200k and 400k tokens per CPU-second -> 300k: 2.
  assert need[1]["per_cpu_s"] == 300_000 and need[1]["workers_needed_cpu"] == 2
  text = "\n".join(bench.plan_tables(demands, supplies, need))
  assert "| b | 400,000 | 1.5x | 200k | **3** [3-4] | 300k | 2 |" in text
  assert "| a | 4 x 8 | 2 | 350k [340-360] | 175k | 3.50x [3.40-3.60] | 262k | 1.0 |" in text


def test_supply_of_one_host_on_a_tiny_corpus(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for i in range(12):
    (corpus / f"doc{i}.txt").write_text(f"document {i}: " + "some words of text. " * 40 * (i + 1))
  config = bench.recipe_config(str(tmp_path / "data"), [f"{corpus}/*.txt"], "",
                               ["--config.data.tokenizer_vocab=300", *TINY])
  assert bench.bytes_per_token(config, examples=4) > 1
  for workers in (0, 1):
    s = bench.measure_supply(config, hosts=2, workers=workers, repeats=2, window_tokens=100)
    assert (s["rows"], s["seq"]) == (4, 64)  # half the batch of 8: one of 2 hosts
    assert len(s["samples"]) == 2 and s["min"] <= s["median"] <= s["max"]
    assert s["batches_per_window"] >= max(workers, 1)
    assert len(s["per_cpu_s"]) == 2 and min(s["per_cpu_s"]) > 0


def test_cpu_time_counts_this_process():
  start = bench.tree_cpu_s()
  sum(i * i for i in range(3_000_000))
  assert bench.tree_cpu_s() > start


def test_step_flops_counts_at_least_the_dense_matmuls():
  from cardjax.config import model_config
  from cardjax.train.flops import matmul_params

  config = load_config(bench.RECIPE, TINY)
  tokens = config.data.batch_size * config.data.seq_len
  assert bench.step_flops(config) >= 6 * matmul_params(model_config(config)) * tokens
