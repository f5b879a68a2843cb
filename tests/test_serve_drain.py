"""`cardjax serve` shutdown and its pieces that need no server: SIGTERM lets in-flight
requests finish before the process exits; the host check, the load-aware tau, the text
stream's stop strings."""

import signal
import threading
import time

import openai
import pytest
from serve_helpers import mars_run, metric, start_server

from cardjax.cli import main
from cardjax.serve.tau import TauControl
from cardjax.serve.text import TextStream


def test_sigterm_drains_in_flight_requests(tmp_path):
  # Batch size 1 and one token per decode call: the second request waits behind the
  # first for 64 decode calls, long enough to be seen in flight by the polling below
  # (with --chunk 4 and 24 tokens the first could finish between two polls on a busy
  # machine, and the test then timed out).
  proc, url = start_server(mars_run(tmp_path), "--batch-sizes", "1", "--chunk", "1")
  try:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    client.completions.create(model="run", prompt="alpha", max_tokens=4)  # compiled
    out = {}

    def ask(name, prompt):
      out[name] = client.completions.create(model="run", prompt=prompt, max_tokens=64,
                                            extra_body={"ignore_eos": True})
    threads = [threading.Thread(target=ask, args=(n, p))
               for n, p in (("a", "alpha beta"), ("b", "one two"))]
    for t in threads:
      t.start()
    deadline = time.monotonic() + 60  # both are in (one decoding, one queued) ...
    while metric(url, "cardjax_running_requests") + metric(url, "cardjax_queue_depth") < 2:
      assert time.monotonic() < deadline, "the requests never reached the scheduler"
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # ... when the server is told to stop
    for t in threads:
      t.join(120)
    assert proc.wait(120) in (0, -signal.SIGTERM)
    assert [out[n].usage.completion_tokens for n in "ab"] == [64, 64]
    assert all(out[n].choices[0].finish_reason == "length" for n in "ab")
  finally:
    proc.kill()
    proc.wait()


def test_serve_binds_loopback_unless_told(tmp_path, capsys):
  assert main(["serve", "--checkpoint", str(tmp_path), "--host", "0.0.0.0"]) == 2
  assert "pass --allow-remote" in capsys.readouterr().err
  assert main(["serve", "--checkpoint", str(tmp_path / "none"), "--batch-sizes", "0,4"]) == 2
  assert "--batch-sizes='0,4' must be positive integers" in capsys.readouterr().err


def test_load_aware_tau_moves_within_its_bounds():
  control = TauControl(0.9, target_ms=100, tau_min=0.6, tau_max=0.9, step=0.1)
  assert control.update(waiting=5) == 0.9  # no finished request slower than the target yet
  control.finished(1.0)  # a slow request: latency above target
  assert [control.update(waiting=5) for _ in range(5)] == [0.8, 0.7, 0.6, 0.6, 0.6]
  assert [control.update(waiting=0) for _ in range(4)] == [0.7, 0.8, 0.9, 0.9]
  fixed = TauControl(0.8)
  fixed.finished(10.0)
  assert fixed.update(waiting=50) == 0.8  # no target: the tau stays
  with pytest.raises(ValueError, match="0 <= tau-min <= tau-max <= 1"):
    TauControl(0.9, target_ms=100, tau_min=0.9, tau_max=0.5)


class _Chars:
  """A tokenizer whose token i is chr(i)."""
  def decode(self, ids, skip_special=False):
    return "".join(chr(i) for i in ids)


def test_text_stream_holds_back_a_possible_stop_string():
  stream = TextStream(_Chars(), stops=["END"])
  ids = [ord(c) for c in "hello EN"]
  assert stream.update(ids, final=False) == ("hello ", False)  # "EN" may start "END"
  assert stream.update(ids + [ord("D"), ord("!")], final=False) == ("", True)
  assert stream.text == "hello "
  plain = TextStream(_Chars())
  assert plain.update([104, 105], final=False) == ("hi", False)
  assert plain.update([104, 105, 0xFFFD], final=False) == ("", False)  # unfinished char
  assert plain.update([104, 105, 0xFFFD], final=True) == ("\ufffd", False)
