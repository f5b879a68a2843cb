"""Which checkpoint objective serves which decoding method."""

import pytest

from cardjax.decoding.methods import METHODS, SERVES, check_method
from cardjax.errors import CardjaxError


def test_each_objective_serves_its_family():
  check_method("mars", "mars")
  check_method("card", "card")
  check_method("dus", "mdlm")
  check_method("dus", "card")
  check_method("ar", None)  # an imported HF model is a causal LM
  assert set(SERVES[None]) == set(METHODS)


@pytest.mark.parametrize("method,objective,fits", [
    ("mars", "card", "ar, card, dus, eb, cb"), ("ar", "mdlm", "dus, eb, cb"),
    ("card", "mars", "ar, mars"), ("dus", "bd3lm", "none of cardjax's decoders yet")])
def test_a_mismatch_names_the_methods_that_fit(method, objective, fits):
  with pytest.raises(CardjaxError, match=f"cannot serve --method {method}; methods that fit: "
                                         f"{fits}"):
    check_method(method, objective)


def test_unknown_method_or_objective():
  with pytest.raises(CardjaxError, match="unknown decoding method 'beam'"):
    check_method("beam", "ar")
  with pytest.raises(CardjaxError, match="objective 'gpt'"):
    check_method("ar", "gpt")


@pytest.mark.parametrize("method,objective,opt", [
    ("ar", "ar", {}), ("mars", "mars", {"tau": 0.5}), ("mars", "mars", {"verify": True}),
    ("mars", "mars", {"tau": 0.5, "window": "full", "temperature": 1.0, "seed": 3}),
    ("mars", "mars", {"tau": 0.4, "cache_block": 8, "accept": "cache", "temperature": 0.8,
                      "top_p": 0.9}),
    ("card", "card", {"order": "dus", "block": 4})])
def test_a_frozen_decoder_equals_the_module_and_compiles_once(method, objective, opt):
  """make_decoder splits the model once; its tokens are the module path's, and a second
  call (or a second decoder on the same Frozen model) reuses the compiled loop."""
  from cardjax.decoding import frozen
  from cardjax.decoding.methods import Options, make_decoder
  from decoding_helpers import PROMPTS, tiny_model

  model = tiny_model()
  options = Options(max_new_tokens=9, **opt)
  decoder = make_decoder(method, model, objective, options)  # partial(generate, Frozen, ...)
  assert isinstance(decoder.args[0], frozen.Frozen)
  want = decoder.func(model, PROMPTS, *decoder.args[1:], **decoder.keywords).rows()
  assert decoder(PROMPTS).rows() == want
  shared = frozen.freeze(model)
  assert frozen.freeze(shared) is shared
  assert make_decoder(method, shared, objective, options)(PROMPTS).rows() == want
  (loop,) = shared._compiled.values()
  size = loop._cache_size()
  assert make_decoder(method, shared, objective, options)(PROMPTS[:2] + PROMPTS[2:]).rows() == want
  assert loop._cache_size() == size == 1


def test_verify_cannot_sample():
  from cardjax.decoding.methods import Options, make_decoder
  from decoding_helpers import tiny_model

  with pytest.raises(CardjaxError, match="--verify decodes exactly AR greedy and cannot "
                                         "sample \\(temperature=0.5\\)"):
    make_decoder("mars", tiny_model(), "mars", Options(verify=True, temperature=0.5))


def test_options_bucket_reaches_the_decoder():
  """Options.bucket is the decoder's prompt width bucket, and the decoder says it
  (eval.measure.warm_up compiles one chunk per padded width)."""
  from cardjax.decoding import prompts
  from cardjax.decoding.methods import Options, make_decoder
  from decoding_helpers import tiny_model

  assert make_decoder("ar", tiny_model(), "ar", Options()).bucket == prompts.BUCKET
  for method, objective in (("ar", "ar"), ("mars", "mars"), ("card", "card"), ("dus", "mdlm")):
    decoder = make_decoder(method, tiny_model(), objective, Options(bucket=48))
    assert decoder.bucket == decoder.keywords["bucket"] == 48


@pytest.mark.parametrize("method,objective,opt", [
    ("ar", "ar", {}), ("mars", "mars", {"tau": 0.5}), ("mars", "mars", {"verify": True}),
    ("mars", "mars", {"tau": 0.4, "cache_block": 8}), ("card", "card", {"block": 4}),
    ("dus", "mdlm", {"block": 4})])
def test_row_forwards_count_each_row_while_it_generates(method, objective, opt):
  """A batched call runs `forwards`; each row counts the forwards it was live in. Rows stop
  at different lengths here (a stop id), and a row's count is what it costs alone when the
  batch moves per row (AR, MARS), at most the batch's when it moves in blocks."""
  from cardjax.decoding.methods import Options, make_decoder
  from decoding_helpers import PROMPTS, tiny_model

  model = tiny_model()
  free = make_decoder(method, model, objective, Options(max_new_tokens=12, **opt))(PROMPTS)
  stop = int(free.tokens[0, 2])  # row 0 stops at its third token, others when they meet it
  options = Options(max_new_tokens=12, stop_ids=(stop,), **opt)
  decode = make_decoder(method, model, objective, options)
  out = decode(PROMPTS)
  assert out.row_forwards.shape == (len(PROMPTS),)
  assert out.forwards == out.row_forwards.max() and (out.row_forwards >= 1).all()
  assert len(set(out.lengths.tolist())) > 1  # rows did stop at different lengths
  if method == "ar":
    assert out.row_forwards.tolist() == out.lengths.tolist()  # one token a live forward
  for i, prompt in enumerate(PROMPTS):
    alone = decode([prompt])
    if method in ("ar", "mars"):
      assert out.row_forwards[i] == alone.forwards
    else:  # blocks: a row waits in a block until the batch's slowest row fills it
      assert alone.forwards <= out.row_forwards[i] <= out.forwards
