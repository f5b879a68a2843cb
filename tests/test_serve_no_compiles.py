"""After its default warm-up, `cardjax serve` compiles nothing while it answers: a mixed
load (prompts of several lengths, AR and MARS, greedy and sampled, some ignoring stop
tokens, 1, 4 and 16 closed-loop clients) leaves /metrics' compilation counter where the
warm-up left it. Programs for prompt prefixes learned while serving compile on the
background thread, counted apart."""

import concurrent.futures

import pytest
from serve_helpers import mars_run, metric, post, start_server

# Over a minute each on 2 cores: `make test-integration` runs them (CI too), not
# `make test`.
pytestmark = pytest.mark.integration

WORDS = "alpha beta gamma delta epsilon one two three four five six".split()


def prompt(n: int) -> str:
  """Prompts of 1 to about 70 tokens (the widths 32 and 64 and the top one)."""
  return " ".join((WORDS[n % 11:] + WORDS) * (n % 5))[:20 + 37 * (n % 7)] or "alpha"


def test_no_request_compiles_after_the_default_warm_up(tmp_path):
  run = mars_run(tmp_path, context=128)
  proc, url = start_server(run, "--warmup-width", "-1", "--batch-sizes", "1,4,16",
                           "--chunk", "4", "--slots", "128", "--compilation-cache",
                           str(tmp_path / "xla"), timeout=900)
  try:
    assert metric(url, "cardjax_compilations_total") == 0

    def client(k: int) -> None:
      for i in range(3):
        n = 7 * k + i
        body = {"model": "run", "prompt": prompt(n), "max_tokens": 3 + n % 9,
                "method": "mars" if n % 2 else "ar", "temperature": 0.8 if n % 3 == 0 else 0,
                "ignore_eos": n % 4 == 0}
        status, answer, _ = post(url, body)
        assert status == 200, answer

    for clients in (1, 4, 16):
      with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    assert metric(url, 'cardjax_requests_total{status="ok"}') == 3 * 21
    assert metric(url, "cardjax_compilations_total") == 0
  finally:
    proc.kill()
    proc.wait()
