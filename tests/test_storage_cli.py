"""The commands that read or write files, run as `cardjax ...` subprocesses on buckets (gs://
and s3://, on local emulators): plan writes its JSON to a bucket; eval reads a bucket run
and writes its report there; generate reads a bucket run and a bucket prompts file; serve
answers from a bucket run; the demo writes every artefact to a bucket. What a bucket run
gives equals what a local copy of the same checkpoint gives."""

import json
import os
import subprocess

import pytest

from cardjax.cli import main
from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.demo import SFT
from cardjax.storage import as_path, trees
from cardjax.train import train
from cloud_emulators import emulated
from launch_helpers import ROOT, checkout_env, cli

# `make test-integration`: 10-20 s a case on 2 cores: CLI runs against the bucket emulators.
pytestmark = pytest.mark.integration

# A tiny AR SFT run on arith_sft (chat template: eval --task arith reads it; nll reads its
# test split), small enough to train in seconds.
RUN = ["--config.model.hidden_size=32", "--config.model.intermediate_size=64",
       "--config.data.seq_len=64", "--config.data.batch_size=8",
       "--config.data.options.train_size=64", "--config.data.options.test_size=12",
       "--config.train.progress=false", "--config.train.eval_steps=1",
       "--config.train.eval_every=0", "--config.train.steps=2",
       "--config.train.checkpoint_every=2", "--config.train.schedule=constant"]


@pytest.fixture(scope="module")
def buckets(tmp_path_factory):
  """Both emulators, each holding the same run (trained in this process into the bucket),
  and a local copy of each bucket run, downloaded as it is stored."""
  tmp = tmp_path_factory.mktemp("storage-cli")
  config = load_config("configs/tiny_sft.py", [f"--config.data.data_dir={tmp / 'data'}",
                                               *SFT, *RUN])
  prepare(config)
  with pytest.MonkeyPatch.context() as mp, emulated("gs") as (_, gs), emulated("s3") as (_, s3):
    mp.setenv("CARDJAX_STAGING_DIR", str(tmp / "staging"))
    out = {"tmp": tmp}
    for scheme, root in (("gs", gs), ("s3", s3)):
      train(config, f"{root}/run")
      trees.download(f"{root}/run", tmp / f"local-{scheme}")
      out[scheme] = root
    yield out


def _run(args, tmp_path, timeout=300) -> subprocess.CompletedProcess:
  """`cardjax ARGS` in a subprocess with the emulators' variables and a fresh staging
  folder (nothing local carried over: what it reads comes from the bucket)."""
  env = checkout_env({**os.environ, "CARDJAX_STAGING_DIR": str(tmp_path / "staging")})
  result = subprocess.run(cli(*args), env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
  assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
  return result


def _main(args, capsys) -> str:
  """`cardjax ARGS` in this process (the local reference), its stdout."""
  capsys.readouterr()
  assert main(list(map(str, args))) == 0, capsys.readouterr().err
  return capsys.readouterr().out


def test_plan_writes_its_json_to_a_bucket(buckets, tmp_path):
  tiny = ["--config.model.num_layers=2", "--config.model.hidden_size=64",
          "--config.data.batch_size=16", "--config.data.seq_len=64"]
  target = f"{buckets['gs']}/plans/plan.json"
  _run(["plan", "--config", "configs/tiny_ar.py", *tiny, "--topology", "8xH200", "--json",
        target], tmp_path)
  plan = json.loads(as_path(target).read_text())
  assert plan["topology"] == "8xH200" and plan["overrides"] == tiny
  assert plan["plans"][0]["fits"] and plan["plans"][0]["mesh"]["fsdp"] == 8


def _without_timing(metrics: dict) -> dict:
  return {k: v for k, v in metrics.items() if "second" not in k}  # timings vary


DECODE = ["--n", "4", "--batch", "4", "--max-new-tokens", "8"]
PROBLEMS = "".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": a + b}) + "\n"
                   for a, b in ((2, 3), (7, 1), (4, 4)))


@pytest.mark.parametrize("task", ["nll", "arith", "jsonl"])
def test_eval_reads_a_bucket_run_and_writes_the_report_there(buckets, task, tmp_path, capsys):
  """The report written to s3:// equals the report of the run's local copy (less the
  paths and the timings); nll compares the gs:// run too (the same training: no
  difference), jsonl reads its --file from s3://."""
  s3, gs = buckets["s3"], buckets["gs"]
  remote_flags, local_flags = {"nll": (["--compare", f"{gs}/run"],
                                       ["--compare", buckets["tmp"] / "local-gs"]),
                               "arith": (DECODE, DECODE),
                               "jsonl": (DECODE + ["--file", f"{s3}/eval/problems.jsonl"],
                                         DECODE + ["--file", tmp_path / "problems.jsonl"])}[task]
  as_path(f"{s3}/eval/problems.jsonl").write_text(PROBLEMS)
  (tmp_path / "problems.jsonl").write_text(PROBLEMS)
  out = f"{s3}/reports/{task}.json"
  _run(["eval", "--checkpoint", f"{s3}/run", "--task", task, *remote_flags, "--out", out],
       tmp_path)
  remote = json.loads(as_path(out).read_text())
  _main(["eval", "--checkpoint", buckets["tmp"] / "local-s3", "--task", task, *local_flags,
         "--out", tmp_path / "local.json"], capsys)
  local = json.loads((tmp_path / "local.json").read_text())
  assert [r["checkpoint"] for r in remote["runs"]] == [f"{s3}/run"] + (
      [f"{gs}/run"] if task == "nll" else [])
  assert {k: v for k, v in remote["task"].items() if k != "file"} == {
      k: v for k, v in local["task"].items() if k != "file"}
  assert remote["settings"] == local["settings"]
  assert len(remote["runs"]) == len(local["runs"])
  for a, b in zip(remote["runs"], local["runs"]):
    assert a["step"] == b["step"] == 2 and a["objective"] == b["objective"] == "ar"
    assert _without_timing(a["metrics"]) == _without_timing(b["metrics"])
    assert a.get("examples") == b.get("examples")
  metrics = remote["runs"][0]["metrics"]
  if task == "nll":
    assert metrics["ar_nll"] > 0 and remote["difference"]["ar_nll"] == 0
  else:
    assert metrics["n"] == (4 if task == "arith" else 3)


def test_harness_reads_a_bucket_run_and_writes_its_results_there(buckets, tmp_path, capsys):
  """`cardjax eval --harness` on the s3:// run, its results JSON written to s3://: the same
  scores and completions as on the run's local copy."""
  s3 = buckets["s3"]
  flags = ["--harness", "arith_mc,arith_sft", "--limit", "2", "--apply-chat-template",
           "--gen-kwargs", "max_gen_toks=8", "--bootstrap-iters", "0", "--log-samples"]
  out = f"{s3}/reports/harness.json"
  _run(["eval", "--checkpoint", f"{s3}/run", *flags, "--output", out], tmp_path)
  remote = json.loads(as_path(out).read_text())
  _main(["eval", "--checkpoint", buckets["tmp"] / "local-s3", *flags, "--output",
         tmp_path / "local.json"], capsys)
  local = json.loads((tmp_path / "local.json").read_text())
  for task in ("arith_mc", "arith_sft"):
    assert [s["resps"] for s in remote["samples"][task]] == \
        [s["resps"] for s in local["samples"][task]], task
  assert remote["results"]["arith_mc"]["cardjax"]["checkpoint"] == f"{s3}/run"


def _texts(printed: str) -> list[str]:
  """generate's output less its last line (speed, which varies)."""
  lines = printed.strip().splitlines()
  assert lines[-1].startswith("method ar (step 2, objective ar): ")
  return lines[:-1]


def test_generate_reads_a_bucket_run_and_prompts_file(buckets, tmp_path, capsys):
  prompts = "What is 2 + 3?\nSam has 4 cards.\n\nWhat is 7 - 1?\n"
  remote = f"{buckets['gs']}/prompts/arith.txt"
  as_path(remote).write_text(prompts)
  (tmp_path / "prompts.txt").write_text(prompts)
  flags = ["--max-new-tokens", "8", "--batch", "2", "--chat"]
  # --tokenizer from a bucket too: the run's own, named explicitly.
  done = _run(["generate", "--checkpoint", f"{buckets['gs']}/run", "--prompts", remote,
               "--tokenizer", f"{buckets['gs']}/run/checkpoints/hf_assets", *flags], tmp_path)
  local = _main(["generate", "--checkpoint", buckets["tmp"] / "local-gs", "--prompts",
                 tmp_path / "prompts.txt", *flags], capsys)
  assert _texts(done.stdout) == _texts(local)
  assert sum(line.startswith("--- ") for line in _texts(local)) == 3


def test_serve_answers_from_a_bucket_run(buckets, tmp_path, capsys, monkeypatch):
  """A completion from `cardjax serve --checkpoint gs://...` is generate's greedy text on
  the local copy."""
  from serve_helpers import post, start_server

  monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging-serve"))
  monkeypatch.setenv("PYTHONPATH", checkout_env(os.environ)["PYTHONPATH"])
  proc, url = start_server(f"{buckets['gs']}/run", "--batch-sizes", "1", "--max-tokens", "6")
  try:
    status, answer, _ = post(url, {"model": "run", "prompt": "What is 2 + 3?",
                                   "max_tokens": 6, "temperature": 0})
  finally:
    proc.kill()
    proc.wait()
  assert status == 200, answer
  local = _main(["generate", "--checkpoint", buckets["tmp"] / "local-gs", "--prompt",
                 "What is 2 + 3?", "--max-new-tokens", "6"], capsys)
  assert answer["model"] == "run"
  assert _texts(local) == ["--- 'What is 2 + 3?'", *answer["choices"][0]["text"].splitlines()]


def test_bad_bucket_inputs_and_outputs_fail_before_the_work(buckets, monkeypatch, capsys):
  """A missing --prompts object or an --out / --json bucket that does not exist is one
  line (status 2) before a checkpoint is restored or a step compiled: here the checkpoint
  does not exist either, and plan's compile is replaced by a failure."""
  import cardjax.plan

  gs = buckets["gs"]

  def fails(argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cardjax: error: ") and "Traceback" not in err, err
    return err

  assert f"--prompts {gs}/missing.txt does not exist" in fails(
      ["generate", "--checkpoint", f"{gs}/nothing", "--prompts", f"{gs}/missing.txt"])
  assert "gs://no-such-bucket: no such bucket" in fails(
      ["eval", "--checkpoint", f"{gs}/nothing", "--task", "nll", "--out",
       "gs://no-such-bucket/report.json"])
  monkeypatch.setattr(cardjax.plan, "run_plan", lambda *a, **k: pytest.fail("compiled"))
  assert "s3://no-such-bucket: no such bucket" in fails(
      ["plan", "--config", "configs/tiny_ar.py", "--topology", "8xH200", "--json",
       "s3://no-such-bucket/plan.json"])


# gs:// in `make test-integration`, s3:// in `make test-slow`: 1-2 min each on 2 CPU cores
# with the tests' XLA cache warm (conftest.py), 3 min cold; its four 60-step runs and its
# decode table do not shrink with the model.
@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["gs", pytest.param("s3", marks=pytest.mark.slow)])
def test_demo_writes_every_artefact_to_a_bucket(scheme, tmp_path):
  """`cardjax demo --quick --workdir gs://...` (or s3://), its models made smaller."""
  with emulated(scheme) as (_, root):
    workdir = f"{root}/demo"
    done = _run(["demo", "--quick", "--workdir", workdir, "--config.model.hidden_size=32",
                 "--config.model.intermediate_size=64", "--config.data.seq_len=64"],
                tmp_path, timeout=900)
    assert f"every artefact is under {workdir}" in done.stdout
    report = json.loads((as_path(workdir) / "report.json").read_text())
    files = set(trees.listing(workdir))
  assert report["orbax_max_abs_diff"] == 0.0 and report["data_resume_exact"] is True
  assert set(report["training"]) == {"ar", "card", "sft", "mars"}
  for name in report["training"]:
    assert f"runs/{name}/metrics.jsonl" in files
    assert any(f.startswith(f"runs/{name}/checkpoints/60/") for f in files), name
  assert {"decode.md", "hf/config.json", "hf/tokenizer.json"} <= files
  assert any(f.startswith("checkpoints/0/") for f in files)
  # The datasets were built in the local staging folder, not in the bucket.
  assert not any(f.startswith("data/") for f in files)
