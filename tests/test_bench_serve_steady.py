"""benchmarks/serve.py: the steady-window rate counts only the time every client was busy;
the server-use columns come from two /metrics scrapes."""

import pytest

from benchmarks import serve


def test_steady_rate_spreads_tokens_over_each_request():
  # Client A: 0-2 s and 2-4 s; client B starts at 1 s: 1-3 s, then stops. Window: 1-3 s.
  spans = [(0.0, 2.0, 32), (2.0, 4.0, 32), (1.0, 3.0, 32)]
  # Inside [1, 3]: half of A's first (16), half of A's second (16), all of B's (32).
  assert serve.steady_rate(spans, 1.0, 3.0) == pytest.approx(64 / 2.0)


def test_steady_rate_of_one_client_is_its_whole_rate():
  spans = [(0.0, 1.0, 10), (1.0, 3.0, 10)]
  assert serve.steady_rate(spans, 0.0, 3.0) == pytest.approx(20 / 3.0)


def test_no_window_no_rate():
  # One request a client: the first client's last answer comes before another's first send.
  assert serve.steady_rate([(0.0, 1.0, 8), (1.5, 2.0, 8)], 1.5, 1.0) is None


def test_server_use_reads_rows_and_thread_shares():
  before = {"cardjax_batch_rows_sum": 10.0, "cardjax_batch_rows_count": 5.0,
            'cardjax_decode_thread_seconds_total{phase="step"}': 1.0}
  after = {"cardjax_batch_rows_sum": 40.0, "cardjax_batch_rows_count": 7.0,
           'cardjax_decode_thread_seconds_total{phase="step"}': 9.0,
           'cardjax_decode_thread_seconds_total{phase="prefill"}': 1.0}
  use = serve.server_use(before, after, wall=10.0)
  assert use == {"rows_per_step": 15.0, "thread_share": {"step": 0.8, "prefill": 0.1}}
  assert serve.server_use(after, after, 10.0) == {"rows_per_step": None,
                                                        "thread_share": {}}
