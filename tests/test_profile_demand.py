"""A profile on demand while the job runs: WORKDIR/PROFILE or SIGUSR1 traces the steps after
the next metrics line (in this process: which steps each trace holds, a request during a
trace waits for it), and in a two-process job, on local disk and on s3://, a signal to one
host makes both hosts trace the same steps."""

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from cloud_emulators import emulated
from launch_helpers import SMALL
from pod_helpers import Hosts, train_args

from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.storage import as_path, is_remote, trees
from cardjax.train import loop, profile_demand, train
from trace_helpers import traced_steps
from train_helpers import prepare_small, small_config


def _traces(profile):
  """{folder under WORKDIR/profile: [the steps of each trace in it]}."""
  found = {}
  for path in sorted(profile.rglob("*.xplane.pb")):
    rel = path.relative_to(profile).parts
    found.setdefault("/".join(rel[:rel.index("plugins")]), []).append(
        traced_steps(path.read_bytes()))
  return found


def test_a_profile_file_and_sigusr1_each_trace_the_steps_after_the_next_line(tmp_path,
                                                                            monkeypatch):
  """Lines every 2 steps, 3 steps per profile. PROFILE touched before step 3: steps 5-7
  (the line of step 4 agrees). SIGUSR1 before step 6, while that trace runs: it waits for
  the line of step 8, then steps 9-11."""
  data_dir = prepare_small(tmp_path / "data")
  run = tmp_path / "run"
  monkeypatch.setattr(profile_demand, "POLL_LOCAL_S", 0.05)
  made = []
  real_requests, real_advance = profile_demand.Requests, loop.Job.advance

  def requests(*args, **kwargs):
    made.append(real_requests(*args, **kwargs))
    return made[-1]

  def advance(job, step):
    if step == 3:
      (run / "PROFILE").touch()
      deadline = time.monotonic() + 30
      while not made[0].asked() and time.monotonic() < deadline:  # the file is noticed
        time.sleep(0.02)
    if step == 6:
      os.kill(os.getpid(), signal.SIGUSR1)
    real_advance(job, step)

  monkeypatch.setattr(profile_demand, "Requests", requests)
  monkeypatch.setattr(loop.Job, "advance", advance)
  train(small_config(data_dir, "--config.train.steps=12", "--config.train.log_every=2",
                     "--config.train.profile_on_demand_steps=3"), run)
  assert _traces(run / "profile") == {"steps_5-7": [[5, 6, 7]], "steps_9-11": [[9, 10, 11]]}
  assert not (run / "PROFILE").exists()
  # SIGUSR1's handler is the one from before the run again.
  assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


@pytest.mark.integration  # a two-process job: half a minute on 2 cores
@pytest.mark.parametrize("where", ["local", "s3"])
def test_sigusr1_to_one_host_makes_every_host_trace_the_same_steps(where, tmp_path):
  """Both hosts trace the same two steps into their own folders; on s3:// the traces reach
  the bucket, and the test watches the job through the bucket's metrics.jsonl."""
  data_dir = tmp_path / "data"
  prepare(load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL]))
  with (emulated("s3") if where == "s3" else contextlib.nullcontext((None, None))) as (
      env, root):
    run = f"{root}/run" if root else str(tmp_path / "run")
    environ = {**os.environ, **(env or {}), "CARDJAX_STAGING_DIR": str(tmp_path / "staging")}
    args = train_args(run, data_dir, 40, "--config.train.log_every=2",
                      "--config.train.metrics_sync_seconds=0",
                      "--config.train.profile_on_demand_steps=2")
    hosts = Hosts(2, args, tmp_path / "logs", env=environ)
    _wait_for_line(run, 4, hosts)
    os.kill(hosts.procs[1].pid, signal.SIGUSR1)  # process 1 only
    assert hosts.wait(timeout=300) == [0, 0], hosts.tail()
    traces = {}
    for rel in _files(f"{run}/profile"):
      if rel.endswith(".xplane.pb"):
        parts = rel.split("/")
        traces.setdefault("/".join(parts[:parts.index("plugins")]), []).append(
            traced_steps((as_path(run) / "profile" / rel).read_bytes()))
  assert len(traces) == 2, traces
  (first, last), = {tuple(map(int, folder.split("/")[0][len("steps_"):].split("-")))
                    for folder in traces}
  assert last == first + 1 and first > 5
  assert traces == {f"steps_{first}-{last}/process_{i}": [[first, last]] for i in range(2)}
  assert f"profiling steps {first}:{last} on every host" in hosts.output(0)


def test_another_hosts_trace_goes_to_the_bucket_from_that_host(tmp_path, monkeypatch):
  """Process 0's trace is uploaded with its metrics; host 1 of a bucket run uploads its own
  (the hosts of a gs:// job share no disk) once its window ends."""
  syncs = []

  class Sync:
    def __init__(self, local, remote):
      syncs.append([local, remote])

    def request(self):
      syncs[-1].append("request")

    def close(self):
      syncs[-1].append("close")

  monkeypatch.setattr(profile_demand, "BucketSync", Sync)
  monkeypatch.setattr(profile_demand.jax, "process_index", lambda: 1)
  window = profile_demand.ProfileWindow((5, 6), tmp_path / "profile" / "steps_5-6" /
                                        "process_1", start=4)
  for workdir, uploads in (("gs://b/run/", 1), (str(tmp_path), 1)):  # local: none more
    profiles = profile_demand.Profiles(window, profile_demand.Requests(workdir, False), 2, 2,
                                       10, tmp_path / "profile", workdir)
    profiles._upload(window)
    profiles.close()
    assert len(syncs) == uploads
  assert syncs == [[window.directory, "gs://b/run/profile/steps_5-6/process_1", "request",
                    "close"]]


def _files(folder):
  """Every file under `folder` (local or a bucket's), relative to it."""
  if is_remote(folder):
    return sorted(trees.listing(folder))
  return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*")
                if p.is_file())


def _wait_for_line(run, step, hosts, timeout=300):
  """Until metrics.jsonl (the bucket's, uploaded while the job runs) has a line of `step`."""
  deadline = time.monotonic() + timeout
  while _last_step(as_path(run) / "metrics.jsonl") < step:
    if any(p.poll() is not None for p in hosts.procs) or time.monotonic() > deadline:
      hosts.kill()
      raise AssertionError(f"the job did not reach step {step}:\n{hosts.tail()}")
    time.sleep(0.2)


def _last_step(path) -> int:
  try:
    text = path.read_text()
  except OSError:  # not there yet, or replaced by an upload while read (s3fs: FileExpired)
    return 0
  return max([json.loads(l)["step"] for l in text.splitlines() if l.strip()], default=0)
