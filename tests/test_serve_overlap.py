"""Overlap (the next step launched before the last is read) and refill steps (short steps
while freed rows wait) change when tokens reach the host, never which: the same requests
under concurrent load get the same completions with and without them, greedy AR and MARS
and seeded sampling alike."""

import concurrent.futures

from serve_helpers import mars_run, post, start_server

WORDS = "alpha beta gamma delta epsilon one two three four five six".split()


def bodies() -> list[dict]:
  out = []
  for n in range(16):
    body = {"model": "run", "prompt": " ".join(WORDS[n % 11:] + WORDS[:n % 5]),
            "max_tokens": 4 + 3 * (n % 6), "method": "mars" if n % 2 else "ar",
            "ignore_eos": n % 3 == 0}
    if n % 4 == 1:
      body.update(temperature=0.9, seed=100 + n)
    out.append(body)
  return out


def answers(run, *flags) -> list[tuple[str, int]]:
  proc, url = start_server(run, "--batch-sizes", "1,4", "--chunk", "3", "--slots", "128",
                           "--tau", "0.7", *flags)
  try:
    def ask(body):
      status, answer, _ = post(url, body)
      assert status == 200, answer
      return answer["choices"][0]["text"], answer["usage"]["completion_tokens"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      return list(pool.map(ask, bodies()))
  finally:
    proc.kill()
    proc.wait()


def test_overlap_on_and_off_give_the_same_completions(tmp_path):
  run = mars_run(tmp_path)
  with_overlap = answers(run, "--refill-step", "1")
  # Neither overlap nor refill steps (of 1 forward here, against chunks of 3) change a token.
  assert with_overlap == answers(run, "--no-overlap")
  assert sum(tokens for _, tokens in with_overlap) > 16 * 4  # they decoded past one step
