"""`cardjax train --profile-steps A:B`: a trace of steps A to B that names the model's parts
(and opens in TensorBoard's profile plugin), and clear errors for a bad window."""

import json
import logging

import jax
import pytest

from cardjax.cli import main

# The tiny AR model made smaller still, on a small slice of its embedded dataset.
TINY = ["--config", "configs/tiny_ar.py", "--config.data.options.max_files=40",
        "--config.data.options.validation_percent=10", "--config.data.seq_len=32",
        "--config.data.batch_size=8", "--config.model.hidden_size=32",
        "--config.model.intermediate_size=64", "--config.train.progress=false",
        "--config.train.eval_steps=1", "--config.train.log_every=1"]
# Op names under the jax.named_scope names of cardjax/model/decoder.py, as the compiled
# train step carries them (jvp: the forward pass inside value_and_grad).
OP_NAMES = ("jit(step_fn)/jvp(embed)/", "jit(step_fn)/jvp(block_0)/attention/",
            "jit(step_fn)/jvp(block_0)/mlp/", "jit(step_fn)/jvp(block_1)/attention/",
            "jit(step_fn)/jvp(block_1)/mlp/", "jit(step_fn)/jvp(lm_head)/")


def _train(root, *extra):
  return main(["train", "--workdir", str(root / "run"), f"--config.data.data_dir={root / 'data'}",
               *TINY, "--config.train.steps=5", *extra])


class _Lines(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.text = ""

  def emit(self, record):
    self.text += record.getMessage() + "\n"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
  """(workdir, the trainer's log) of 5 steps with --profile-steps 2:4. The persistent
  compilation cache is off: its key leaves op names out, so an entry compiled before the
  scopes existed would hide them."""
  root = tmp_path_factory.mktemp("profiled")
  cache = jax.config.jax_enable_compilation_cache
  logger, lines = logging.getLogger("cardjax.train"), _Lines()
  level = logger.level
  logger.addHandler(lines)
  logger.setLevel(logging.INFO)
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    assert _train(root, "--profile-steps", "2:4") == 0
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
    logger.removeHandler(lines)
    logger.setLevel(level)
  return root / "run", lines.text


def _trace(workdir):
  traces = list((workdir / "profile").rglob("*.xplane.pb"))
  assert len(traces) == 1, traces
  return traces[0]


def test_profile_steps_write_a_trace_that_names_the_blocks(profiled):
  workdir, log = profiled
  data = _trace(workdir).read_bytes()
  assert [n for n in OP_NAMES if n.encode() not in data] == []  # in the step's HLO
  assert b"step_num" in data and b"train" in data  # the StepTraceAnnotation
  # The profiled run is the same run: five metric lines, the checkpoint at the end.
  lines = [json.loads(l) for l in open(workdir / "metrics.jsonl")]
  assert [l["step"] for l in lines if "train/loss" in l] == [1, 2, 3, 4, 5]
  assert (workdir / "checkpoints" / "5").is_dir()
  assert f"tensorboard --logdir {workdir / 'profile'}" in log


def test_the_profile_plugin_shows_the_steps_and_the_block_names(profiled):
  """What TensorBoard's profile plugin (xprof) serves: the trace viewer's steps 2, 3, 4, and
  in the graph viewer the train step's ops under the block names."""
  raw_to_tool_data = pytest.importorskip("xprof.convert.raw_to_tool_data")
  path = str(_trace(profiled[0]))
  trace, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})
  steps = {e["name"] for e in json.loads(trace)["traceEvents"]
           if str(e.get("name", "")).startswith("train ")}
  assert steps == {"train 2", "train 3", "train 4"}
  # Listing the tools writes each compiled module's HLO beside the trace, as the plugin does.
  raw_to_tool_data.xspace_to_tool_names([path])
  module = next(p.name[:-len(".hlo_proto.pb")] for p in _trace(profiled[0]).parent.iterdir()
                if p.name.startswith("jit_step_fn("))
  hlo, _ = raw_to_tool_data.xspace_to_tool_data(
      [path], "graph_viewer", {"graph_viewer_options": {"module_name": module, "type": "pbtxt"}})
  hlo = hlo.decode() if isinstance(hlo, bytes) else hlo
  assert [n for n in OP_NAMES if f'op_name: "{n}' not in hlo] == []


@pytest.mark.parametrize("value, needle", [
    ("5:3", "need 1 <= A <= B"), ("x", "are not A:B"), ("0:2", "need 1 <= A <= B"),
    ("2:9", "end after train.steps=5")])
def test_bad_profile_steps_are_one_line_errors(tmp_path, capsys, value, needle):
  """A malformed window is argparse's usage error, one past train.steps the command's one
  line; both exit 2 before any work."""
  try:
    code = _train(tmp_path, f"--profile-steps={value}")
  except SystemExit as e:
    code = e.code
  assert code == 2
  assert needle in capsys.readouterr().err
  assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()
