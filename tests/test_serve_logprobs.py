"""`logprobs` and `echo` on /v1/completions: one server subprocess on a tiny MARS-run
checkpoint. Every reported log-probability equals a numpy log_softmax of the model's
full-sequence logits computed in this process, for the prompt (echo, max_tokens 0) and for
the tokens AR and MARS generate (AR order whatever the method); bad uses get 400."""

import numpy as np
import pytest
from serve_helpers import mars_run, post, start_server

from cardjax import checkpoint
from cardjax.decoding.methods import Options, make_decoder
from cardjax.serve.scoring import token_string

PROMPT = "alpha beta gamma one two"
# The server scores in one jitted forward over a padded batch, the reference runs eagerly
# over the bare sequence: the same fp32 model, summed in another order.
ATOL = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  run = mars_run(tmp_path_factory.mktemp("logprobs"))
  proc, url = start_server(run, "--method", "mars", "--tau", "0.9", "--batch-sizes", "1,4",
                           "--chunk", "8", "--max-tokens", "12")
  yield run, url
  proc.kill()
  proc.wait()


@pytest.fixture(scope="module")
def reference(server):
  """(tokenizer, logp(ids) -> [len, vocab] float64 log-probabilities of the token after
  each position, decode(method, ids, n, **knobs) -> the decoders' generated ids)."""
  model, _ = checkpoint.restore_model(server[0] / "checkpoints")
  tok = checkpoint.load_tokenizer(server[0] / "checkpoints", model.cfg)

  def logp(ids):
    logits = np.asarray(model(np.asarray([ids], np.int32))[0], np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

  def decode(method, ids, n, **knobs):
    options = Options(max_new_tokens=n, stop_ids=tok.stop_ids, pad_id=tok.pad_id, block=4,
                      **knobs)
    return make_decoder(method, model, "mars", options)([ids]).rows()[0]
  return tok, logp, decode


def _post(url, body: dict, route="/v1/completions"):
  return post(url, body, route)[:2]


def _check_scores(tok, lp, ids, logprobs, top, first):
  """`logprobs` (the response's object) covers ids[first:]; each entry against `lp`."""
  assert logprobs["tokens"] == [token_string(tok, i) for i in ids[first:]]
  for k, i in enumerate(range(first, len(ids))):
    value, alternatives = logprobs["token_logprobs"][k], logprobs["top_logprobs"][k]
    if i == 0:  # the first token has no context: OpenAI's null
      assert value is None and alternatives is None
      continue
    row = lp[i - 1]
    assert abs(value - row[ids[i]]) < ATOL, (i, value, row[ids[i]])
    order = np.argsort(-row)
    best = order[:top]
    # One entry per distinct string (two byte pieces may print alike), best first; near
    # ties may order differently here and on the server, so each entry is checked by value.
    assert len(alternatives) == len({token_string(tok, b) for b in best}), i
    values = list(alternatives.values())
    assert values == sorted(values, reverse=True)
    for name, v in alternatives.items():
      assert min((abs(v - row[b]) for b in order[:top + 2] if token_string(tok, b) == name),
                 default=np.inf) < ATOL, (i, name)
    if len(order) > top and values:
      assert values[-1] > row[order[top]] - ATOL
    if ids[i] == best[0]:  # a greedy token is the top alternative, to the bit
      assert value == max(alternatives.values())


def test_echo_scores_the_prompt(server, reference):
  tok, logp, _ = reference
  ids = tok.encode(PROMPT)
  status, r = _post(server[1], {"model": "run", "prompt": PROMPT, "max_tokens": 0,
                                "echo": True, "logprobs": 3})
  assert status == 200, r
  choice = r["choices"][0]
  assert choice["text"] == PROMPT and r["usage"]["completion_tokens"] == 0
  assert all(len(t) == 3 for t in choice["logprobs"]["top_logprobs"][1:])
  _check_scores(tok, logp(ids), ids, choice["logprobs"], 3, 0)
  assert choice["logprobs"]["text_offset"] == [len(tok.decode(ids[:k]))
                                               for k in range(len(ids))]
  # Several prompts, one as token ids: one batched scoring forward, each row its own.
  other = tok.encode("five six alpha delta epsilon one")
  status, r = _post(server[1], {"model": "run", "prompt": [PROMPT, other], "max_tokens": 0,
                                "echo": True, "logprobs": 0})
  assert status == 200, r
  for choice, seq in zip(r["choices"], (ids, other)):
    lp = logp(seq)
    assert choice["logprobs"]["top_logprobs"][1:] == [{}] * (len(seq) - 1)
    assert all(abs(v - lp[k][seq[k + 1]]) < ATOL
               for k, v in enumerate(choice["logprobs"]["token_logprobs"][1:]))
  assert r["choices"][1]["text"] == tok.decode(other)


# (request fields, the in-process decoder that writes the same tokens): AR and MARS in
# the server's SlotPools, self-verified MARS (exactly AR greedy) in its chunked calls.
DECODERS = [({"method": "ar"}, "ar", {}), ({"method": "mars"}, "mars", {"tau": 0.9}),
            ({"method": "mars", "verify": True}, "ar", {})]


@pytest.mark.parametrize("fields,method,knobs", DECODERS)
def test_generated_tokens_are_scored_in_ar_order(server, reference, fields, method, knobs):
  tok, logp, decode = reference
  ids = tok.encode(PROMPT)
  row = decode(method, ids, 10, **knobs)
  status, r = _post(server[1], {"model": "run", "prompt": PROMPT, "max_tokens": 10,
                                "logprobs": 2, **fields})
  assert status == 200, r
  choice = r["choices"][0]
  assert choice["text"] == tok.decode(row, skip_special=True)
  seq = ids + row
  _check_scores(tok, logp(seq), seq, choice["logprobs"], 2, len(ids))
  # text_offset counts from the prompt's start, echoed or not (as OpenAI's).
  assert choice["logprobs"]["text_offset"][0] == len(PROMPT)
  if method == "ar":  # greedy AR (verify too): every token is its position's best
    lp = choice["logprobs"]
    assert all(v == max(t.values()) for v, t in zip(lp["token_logprobs"], lp["top_logprobs"]))
  # echo: prompt then completion, in text and in the arrays.
  status, e = _post(server[1], {"model": "run", "prompt": PROMPT, "max_tokens": 10,
                                "logprobs": 2, "echo": True, **fields})
  assert e["choices"][0]["text"] == PROMPT + choice["text"]
  both = e["choices"][0]["logprobs"]
  assert both["token_logprobs"][len(ids):] == choice["logprobs"]["token_logprobs"]
  assert both["text_offset"][len(ids):] == choice["logprobs"]["text_offset"]


def test_a_stop_string_cuts_the_scored_tokens(server, reference):
  tok, _, decode = reference
  row = decode("ar", tok.encode(PROMPT), 10)
  full = tok.decode(row, skip_special=True)
  cut = full[3:5]
  status, r = _post(server[1], {"model": "run", "prompt": PROMPT, "max_tokens": 10,
                                "logprobs": 1, "stop": [cut], "method": "ar"})
  choice = r["choices"][0]
  assert choice["text"] == full[:full.find(cut)]
  # The tokens up to the one that reaches the cut: they cover the text, no more.
  n = next(n for n in range(len(row) + 1)
           if len(tok.decode(row[:n], skip_special=True)) >= len(choice["text"]))
  assert choice["logprobs"]["tokens"] == [token_string(tok, t) for t in row[:n]]


def test_bad_logprobs_and_echo_get_400(server):
  url = server[1]
  cases = [({"prompt": "a", "logprobs": 6}, "at most 5 top alternatives"),
           ({"prompt": "a", "logprobs": True}, "must be an integer"),
           ({"prompt": "a", "echo": "yes"}, "echo='yes' must be true or false"),
           ({"prompt": "a", "echo": True, "logprobs": 1, "stream": True}, "not streamed"),
           ({"prompt": "a", "max_tokens": 0}, "or 0 with echo: true"),
           ({"prompt": "a", "top_logprobs": 2}, "top_logprobs is a chat field")]
  for body, message in cases:
    status, answer = _post(url, {"model": "run", **body})
    assert status == 400 and message in answer["error"]["message"], (body, answer)
  for body in ({"logprobs": True}, {"logprobs": True, "top_logprobs": 2}, {"echo": True}):
    status, answer = _post(url, {"model": "run", "messages": [{"role": "user",
                                                              "content": "a"}], **body},
                           "/v1/chat/completions")
    assert status == 400 and "use /v1/completions" in answer["error"]["message"], body
  status, r = _post(url, {"model": "run", "prompt": "a", "max_tokens": 2})
  assert status == 200 and r["choices"][0]["logprobs"] is None
