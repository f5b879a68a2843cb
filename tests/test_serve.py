"""`cardjax serve` end to end: one server subprocess on a tiny MARS-run checkpoint, talked
to with the openai client. Its greedy tokens equal the decoders called in-process, batched
requests with different settings do not mix, bad requests get 4xx and the server keeps
serving, a client that leaves mid-stream frees its row."""

import concurrent.futures
import json
import time
import urllib.error
import urllib.request

import openai
import pytest
from serve_helpers import mars_run, metric, post, start_server

from cardjax import checkpoint
from cardjax.decoding.methods import Options, make_decoder

CHUNK = 8
PROMPTS = ["alpha beta", "one two three", "gamma", "five six alpha delta epsilon"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  run = mars_run(tmp_path_factory.mktemp("serve"))
  proc, url = start_server(run, "--method", "mars", "--tau", "0.9", "--batch-sizes", "1,4",
                           "--chunk", str(CHUNK), "--max-tokens", "12")
  yield run, url
  proc.kill()
  proc.wait()


@pytest.fixture(scope="module")
def client(server):
  return openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(server):
  """decode(method, prompt_text, max_tokens, **options) -> (text, n tokens) from the
  decoders in this process, on the server's checkpoint."""
  model, _ = checkpoint.restore_model(server[0] / "checkpoints")
  tok = checkpoint.load_tokenizer(server[0] / "checkpoints", model.cfg)

  def decode(method, text, max_tokens, chat=False, system=None, **knobs):
    if chat:
      messages = [{"role": "system", "content": system}] if system else []
      text = tok.render_chat(messages + [{"role": "user", "content": text}],
                             add_generation_prompt=True)
    options = Options(max_new_tokens=max_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                      block=4, **knobs)
    row = make_decoder(method, model, "mars", options)([tok.encode(text)]).rows()[0]
    return tok.decode(row, skip_special=True), len(row)
  return decode


def test_completions_equal_the_decoders(client, reference):
  assert [m.id for m in client.models.list().data] == ["run"]
  # AR over two chunks (12 > CHUNK: a refilled row), MARS within one, verify over two.
  for extra, method, knobs, n in (({"method": "ar"}, "ar", {}, 12),
                                  ({}, "mars", {"tau": 0.9}, CHUNK),
                                  ({"tau": 0.5}, "mars", {"tau": 0.5}, CHUNK),
                                  ({"verify": True}, "ar", {}, 12)):
    r = client.completions.create(model="run", prompt=PROMPTS[0], max_tokens=n,
                                  temperature=0, extra_body=extra)
    text, tokens = reference(method, PROMPTS[0], n, **knobs)
    assert (r.choices[0].text, r.usage.completion_tokens) == (text, tokens), extra
    assert r.usage.prompt_tokens == 2 and r.usage.forwards >= 1
    info = r.model_extra["cardjax"][0]
    assert info["method"] == ("ar" if extra.get("method") == "ar" else "mars")
    if extra.get("tau") == 0.5:
      assert info["tau"] == 0.5 and info["block"] == 4
    if not extra:
      assert info["tau"] == 0.9  # the server's --tau


def test_a_shared_system_turn_is_prefilled_once(client, server, reference):
  """Chat requests with one long system message: once its KV is learned (from the first
  two prompts) and its prefill programs compiled (off the decode thread, while requests
  prefill all their tokens), it comes from the prefix cache, and the answers do not
  change. No request compiled anything for it."""
  system = " ".join(["alpha beta gamma delta epsilon one two three four five six"] * 3)
  url = server[1]
  def ask(question, method) -> float:
    """The prompt tokens the request read from the prefix store; its answer checked."""
    before = metric(url, "cardjax_prefix_cached_tokens_total")
    r = client.chat.completions.create(
        model="run", max_tokens=10, extra_body={"method": method},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    knobs = {"tau": 0.9} if method == "mars" else {}
    assert (r.choices[0].message.content, r.usage.completion_tokens) == \
        reference(method, question, 10, chat=True, system=system, **knobs), question
    return metric(url, "cardjax_prefix_cached_tokens_total") - before

  cached = [ask(PROMPTS[0], "ar")]
  for _ in range(20):  # until the stored prefix is in use
    cached.append(ask(PROMPTS[2], "ar"))
    if cached[-1] > 0:
      break
    time.sleep(0.5)  # its programs compile in the background
  mars = []
  for _ in range(20):  # the MARS pool reads the same prefix (its longest prefill programs
    mars.append(ask(PROMPTS[1], "mars"))  # may still be compiling on a loaded machine)
    if mars[-1] == cached[-1]:
      break
    time.sleep(0.5)
  assert metric(url, "cardjax_background_compilations_total") > 0
  assert cached[0] == 0 and cached[-1] >= 32 and mars[-1] == cached[-1], (cached, mars)


def test_ar_and_mars_rows_keep_their_cache_other_methods_re_prefill(client, server):
  """Continuous batching: a 12-token AR or MARS request over 8-forward steps is prefilled
  once; self-verified MARS decodes in chunks and re-prefills each one."""
  url = server[1]
  for extra, prefills in (({"method": "ar"}, 1), ({"tau": 0.5}, 1), ({"verify": True}, 2)):
    before = metric(url, "cardjax_prefills_total")
    r = client.completions.create(model="run", prompt=PROMPTS[1], max_tokens=12,
                                  extra_body={**extra, "ignore_eos": True})
    assert r.usage.completion_tokens == 12
    if extra.get("method") == "ar":  # 12 tokens at one a forward: two 8-forward steps
      assert r.model_extra["cardjax"][0]["chunks"] == 2
    assert metric(url, "cardjax_prefills_total") - before == prefills, extra


def test_chat_and_streaming(client, reference):
  messages = [{"role": "user", "content": PROMPTS[1]}]
  whole = client.chat.completions.create(model="run", messages=messages, max_tokens=12,
                                         extra_body={"method": "ar"})
  assert (whole.choices[0].message.content, whole.usage.completion_tokens) == \
      reference("ar", PROMPTS[1], 12, chat=True)
  events = list(client.chat.completions.create(
      model="run", messages=messages, max_tokens=12, stream=True,
      stream_options={"include_usage": True}, extra_body={"method": "ar"}))
  assert events[0].choices[0].delta.role == "assistant"
  assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == \
      whole.choices[0].message.content
  ends = [e.choices[0].finish_reason for e in events if e.choices and
          e.choices[0].finish_reason]
  assert ends == [whole.choices[0].finish_reason]
  assert events[-1].usage.completion_tokens == whole.usage.completion_tokens
  # Completions streamed with MARS: the same text as not streamed.
  args = dict(model="run", prompt=PROMPTS[3], max_tokens=CHUNK, extra_body={"tau": 0.7})
  text = client.completions.create(**args).choices[0].text
  assert "".join(e.choices[0].text for e in client.completions.create(stream=True, **args)) \
      == text


def test_concurrent_requests_batch_without_mixing_settings(client, reference, server):
  rows_before = metric(server[1], "cardjax_batch_rows_sum")
  calls_before = metric(server[1], "cardjax_batch_rows_count")

  def ask(i):
    if i % 3 == 2:  # sampled rows between greedy ones, in the same steps
      return client.completions.create(model="run", prompt=PROMPTS[i % 4], max_tokens=10,
                                        temperature=1.0, top_p=0.9, seed=i,
                                        extra_body={"method": "ar"})
    return client.completions.create(model="run", prompt=PROMPTS[i % 4], max_tokens=10,
                                      extra_body={"method": "ar"})
  with concurrent.futures.ThreadPoolExecutor(9) as pool:
    out = list(pool.map(ask, range(9)))
  for i, r in enumerate(out):
    if i % 3 != 2:
      assert r.choices[0].text == reference("ar", PROMPTS[i % 4], 10)[0], i
  rows = metric(server[1], "cardjax_batch_rows_sum") - rows_before
  calls = metric(server[1], "cardjax_batch_rows_count") - calls_before
  assert rows / calls > 1.0  # some decode calls held several requests
  # A seeded sampled request is reproducible (its draws are keyed by its seed and
  # positions, whatever rows share its steps).
  again = client.completions.create(model="run", prompt=PROMPTS[2 % 4], max_tokens=10,
                                    temperature=1.0, top_p=0.9, seed=2,
                                    extra_body={"method": "ar"})
  assert again.choices[0].text == out[2].choices[0].text


def test_metrics_count_a_decode_call_before_its_answer_returns(client, server):
  # A load test reads /metrics right after its last answer: the call must be counted by then.
  calls = metric(server[1], "cardjax_batch_rows_count")
  client.completions.create(model="run", prompt=PROMPTS[0], max_tokens=4,
                            extra_body={"method": "ar"})
  assert metric(server[1], "cardjax_batch_rows_count") > calls
  # ...and its decode thread's time by phase (what the load test divides by wall time).
  assert metric(server[1], 'cardjax_decode_thread_seconds_total{phase="step"}') > 0
  assert metric(server[1], 'cardjax_decode_thread_seconds_total{phase="prefill"}') > 0


def _post(url, body: bytes):
  return post(url, body, timeout=30)[:2]


def test_bad_requests_get_4xx_and_the_server_keeps_serving(client, server):
  url = server[1]
  status, body = _post(url, b'{"model": "run", "prompt": ')
  assert status == 400 and "not valid JSON" in body["error"]["message"]
  cases = [({"model": "gpt-4", "prompt": "a"}, 404, "model 'gpt-4' does not exist"),
           ({"model": "run", "prompt": "alpha " * 200}, 400, "more than the"),
           ({"model": "run", "prompt": "a", "max_tokens": 0}, 400, "max_tokens=0 must be >= 1"),
           ({"model": "run", "prompt": "a", "method": "card"}, 400,
            "cannot serve --method card; methods that fit: ar, mars"),
           ({"model": "run", "prompt": "a", "tau": 1.5}, 400, "tau=1.5 must lie in [0, 1]"),
           ({"model": "run", "prompt": "a", "verify": True, "temperature": 0.5}, 400,
            "verify decodes exactly AR greedy"),
           ({"model": "run", "prompt": 7}, 400, "prompt must be")]
  for body, code, message in cases:
    status, answer = _post(url, json.dumps(body).encode())
    assert status == code and message in answer["error"]["message"], (body, answer)
    assert answer["error"]["type"] == "invalid_request_error"
  with pytest.raises(urllib.error.HTTPError) as got:  # a completion path takes POST only
    urllib.request.urlopen(url + "/v1/chat/completions", timeout=30)
  assert got.value.code == 405 and "takes POST" in json.loads(got.value.read())["error"][
      "message"]
  with pytest.raises(openai.BadRequestError, match="max_tokens=-3"):
    client.completions.create(model="run", prompt="a", max_tokens=-3)
  assert client.completions.create(model="run", prompt="a", max_tokens=3).usage.completion_tokens
  assert metric(url, 'cardjax_requests_total{status="bad_request"}') >= len(cases) + 2


def test_stop_strings_end_the_text(client):
  full = client.completions.create(model="run", prompt=PROMPTS[0], max_tokens=12,
                                   extra_body={"method": "ar"}).choices[0].text
  cut = full[3:5]
  r = client.completions.create(model="run", prompt=PROMPTS[0], max_tokens=12, stop=[cut],
                                extra_body={"method": "ar"})
  assert r.choices[0].text == full[:full.find(cut)] and r.choices[0].finish_reason == "stop"


def test_a_client_leaving_mid_stream_frees_its_row(tmp_path):
  # Its own server decoding one token per call: 2000 decode calls outlast the hang-up by
  # far; with the shared server's 8-token chunks, or 100 tokens once the server launched
  # each step before reading the last, a loaded machine could finish the request before
  # the disconnect was seen (each failed once so in make test).
  proc, url = start_server(mars_run(tmp_path, context=2048), "--batch-sizes", "1",
                           "--chunk", "1", "--slots", "2048")
  try:
    _leave_mid_stream(url)
    _leave_while_waiting(url)
    # The pool's step that was in flight when its only request left is dropped, not
    # waited for: the next request is served as usual.
    status, answer, _ = post(url, {"model": "run", "prompt": PROMPTS[0], "max_tokens": 5,
                                   "method": "ar", "ignore_eos": True})
    assert status == 200 and answer["usage"]["completion_tokens"] == 5
  finally:
    proc.kill()
    proc.wait()


def _leave_while_waiting(url):
  """A client of a whole (non-streamed) answer hangs up while its row decodes: the server
  sees the connection close (no answer is written to notice it) and frees the row."""
  import socket

  cancelled = metric(url, 'cardjax_requests_total{status="cancelled"}')
  body = json.dumps({"model": "run", "prompt": PROMPTS[0], "max_tokens": 2000,
                     "method": "ar", "ignore_eos": True}).encode()
  host, port = url.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=30) as sock:
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 60
    while metric(url, "cardjax_running_requests") == 0:  # its row is decoding
      assert time.monotonic() < deadline, "the request never started"
      time.sleep(0.05)
  _await_cancelled(url, cancelled, "the abandoned whole answer")


def _await_cancelled(url, cancelled: float, what: str):
  # Both gauges too: a cancellation the decode thread meets between rounds once left
  # them at their last round's values.
  names = ['cardjax_requests_total{status="cancelled"}', "cardjax_running_requests",
           "cardjax_queue_depth"]
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    seen = [metric(url, name) for name in names]
    if seen[0] > cancelled and seen[1] == 0 and seen[2] == 0:
      return
    time.sleep(0.2)
  pytest.fail(f"{what}'s request was not cancelled: {dict(zip(names, seen))}")


def _leave_mid_stream(url):
  import httpx2

  cancelled = metric(url, 'cardjax_requests_total{status="cancelled"}')
  body = {"model": "run", "prompt": PROMPTS[0], "max_tokens": 2000, "stream": True,
          "method": "ar", "ignore_eos": True}  # 2000 tokens: it cannot end by itself soon
  with httpx2.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
    for line in r.iter_lines():
      if line.startswith("data: "):
        break  # the first chunk arrived; hang up
  _await_cancelled(url, cancelled, "the abandoned stream")
  text = metric(url, "cardjax_generated_tokens_total")
  assert text > 0 and metric(url, "cardjax_time_to_first_token_seconds_count") > 0
