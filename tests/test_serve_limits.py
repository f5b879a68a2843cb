"""The limits of a shared `cardjax serve`: an API key (401), a body-size limit checked
before the body is parsed (413), a bounded queue (429 with Retry-After, then the server
drains and answers), and 400 for a chat role it cannot render and for non-finite numbers."""

import json
import socket
import urllib.error
import urllib.request

import httpx2
import openai
import pytest
import serve_helpers
from serve_helpers import mars_run, start_server

from cardjax.cli import main

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  run = mars_run(tmp_path_factory.mktemp("serve_limits"), context=1024)
  proc, url = start_server(run, "--api-key", KEY, "--max-queue", "1", "--batch-sizes", "1",
                           "--chunk", "1", "--slots", "1024", "--max-body-bytes", "20000")
  yield url
  proc.kill()
  proc.wait()


def post(url, body: bytes, key: str | None = KEY, path="/v1/completions"):
  return serve_helpers.post(url, body, path, key, timeout=60)


def body(**kw) -> bytes:
  return json.dumps({"model": "run", "prompt": "alpha beta", "max_tokens": 3, **kw}).encode()


def test_the_api_key_is_required(server):
  for key in (None, "wrong", KEY + "x"):
    status, answer, _ = post(server, body(), key)
    assert status == 401 and answer["error"]["code"] == "invalid_api_key", key
    assert "Authorization: Bearer" in answer["error"]["message"]
  request = urllib.request.Request(server + "/v1/models")
  with pytest.raises(urllib.error.HTTPError, match="401"):
    urllib.request.urlopen(request, timeout=30)
  client = openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)
  assert client.completions.create(model="run", prompt="a", max_tokens=2).usage
  assert [m.id for m in client.models.list().data] == ["run"]
  with pytest.raises(openai.AuthenticationError):
    openai.OpenAI(base_url=server + "/v1", api_key="nope", max_retries=0).models.list()


def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
  # A 12 MB body announced by its Content-Length: the answer comes before a byte of it is
  # sent (a client that sends it all anyway sees the connection closed under it).
  host, port = server.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=30) as sock:
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                 f"{KEY}\r\nContent-Type: application/json\r\nContent-Length: 12000000"
                 "\r\n\r\n".encode())
    reply = b""
    while b"}}" not in reply:
      part = sock.recv(65536)
      if not part:
        break
      reply += part
  head, _, payload = reply.partition(b"\r\n\r\n")
  assert head.startswith(b"HTTP/1.1 413"), head
  answer = json.loads(payload)
  assert answer["error"]["code"] == "request_too_large"
  assert "--max-body-bytes" in answer["error"]["message"]

  def chunks():  # no Content-Length: counted while it streams in
    yield body()[:-1]
    for _ in range(100):
      yield b" " * 1000
    yield b"}"
  r = httpx2.post(server + "/v1/completions", content=chunks(), timeout=30,
                 headers={"Authorization": f"Bearer {KEY}",
                          "Content-Type": "application/json"})
  assert r.status_code == 413
  assert post(server, body())[0] == 200  # just under the limit is fine


def test_a_full_queue_answers_429_then_drains(server):
  client = openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)
  long = dict(model="run", prompt="alpha beta", max_tokens=600, stream=True,
              extra_body={"method": "ar", "ignore_eos": True})
  running = client.completions.create(**long)
  next(iter(running))  # the one row is taken
  queued = client.completions.create(**long)  # returns once the server has queued it
  status, answer, headers = post(server, body())
  assert status == 429 and headers["Retry-After"] == "1", answer
  assert answer["error"]["type"] == "rate_limit_error"
  assert "--max-queue" in answer["error"]["message"]
  for stream in (running, queued):
    assert sum(len(e.choices[0].text) > 0 for e in stream) > 0
  assert post(server, body())[0] == 200


def test_bad_roles_and_non_finite_numbers_get_400(server):
  chat = {"model": "run", "max_tokens": 2}
  status, answer, _ = post(server, json.dumps(
      {**chat, "messages": [{"role": "tool", "content": "x"}]}).encode(),
      path="/v1/chat/completions")
  assert status == 400 and "role 'tool' is not one of system, user, assistant" in \
      answer["error"]["message"]
  for raw in (b'{"model": "run", "prompt": "a", "temperature": NaN}',
              b'{"model": "run", "prompt": "a", "top_p": Infinity}',
              b'{"model": "run", "prompt": "a", "tau": -Infinity}'):
    status, answer, _ = post(server, raw)
    assert status == 400 and "must be finite" in answer["error"]["message"], raw
  assert post(server, json.dumps({**chat, "messages": [
      {"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}).encode(),
      path="/v1/chat/completions")[0] == 200


def test_remote_binding_needs_an_api_key(tmp_path, capsys, monkeypatch):
  monkeypatch.delenv("CARDJAX_API_KEY", raising=False)
  args = ["serve", "--checkpoint", str(tmp_path), "--host", "0.0.0.0"]
  assert main(args + ["--allow-remote"]) == 2
  assert "needs --api-key" in capsys.readouterr().err
  assert main(["serve", "--checkpoint", str(tmp_path), "--max-queue", "-1"]) == 2
  assert "--max-queue=-1 must be >= 0" in capsys.readouterr().err


def test_prompt_plus_max_tokens_over_the_context_gets_400_naming_both(server):
  status, answer, _ = post(server, body(max_tokens=10**9))
  error = answer["error"]
  assert status == 400 and error["code"] == "context_length_exceeded"
  assert error["param"] == "max_tokens"
  message = error["message"]
  prompt = int(message.split("the prompt has ")[1].split()[0])
  holds = int(message.split("more than the ")[1].split()[0])
  fits = int(message.split("at most ")[1].split()[0])
  assert "max_tokens is 1000000000" in message and fits == holds - prompt > 0
  status, answer, _ = post(server, body(max_tokens=fits + 1))
  assert status == 400 and f"at most {fits} " in answer["error"]["message"]
