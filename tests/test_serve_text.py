"""Incremental detokenization of streamed completions (cardjax/serve/text.py) equals
decoding the whole generation at every step: for byte-level BPE, whose characters can split
across tokens and steps, and for a SentencePiece-style decoder, which drops the leading
space of a window's first token; stop strings split across two steps are found."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cardjax.data.tokenizer import train_bpe
from cardjax.serve.text import TextStream

TEXTS = ["héllo wörld, naïve café — ünïcødé", "你好，世界。汉字在这里", "emoji 🎉🚀 and ✓ marks",
         "plain ascii words and numbers 12345", "mixed: Grüße 🎉 你好 end"] * 8


class Wrapped:
  """The decode() of cardjax's Tokenizer over a bare `tokenizers` one."""

  def __init__(self, tok):
    self.tok = tok

  def decode(self, ids, skip_special=False):
    return self.tok.decode(list(ids), skip_special_tokens=skip_special)

  def encode(self, text):
    return self.tok.encode(text).ids


def whole_decode_reference(tok, stops, steps):
  """The deltas of the earlier, whole-generation TextStream: the reference."""
  hold = max((len(s) for s in stops), default=1) - 1
  sent, out, text = 0, [], None
  for tokens, final in steps:
    full = tok.decode(tokens, skip_special=True)
    cut = min((i for i in (full.find(s, max(0, sent - hold)) for s in stops) if i >= 0),
              default=-1)
    if cut >= 0:
      full = full[:cut]
    end = len(full)
    if not (final or cut >= 0):
      end = max(sent, end - hold)
      while end > sent and full[end - 1] == "\ufffd":
        end -= 1
    out.append((full[sent:end], cut >= 0))
    sent = end
    if final or cut >= 0:
      text = full
      break
  return out, text


def byte_bpe(tmp_path):
  return train_bpe(TEXTS, 300, tmp_path / "tok")


def metaspace(tmp_path):
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"]))
  return Wrapped(tok)


@pytest.mark.parametrize("make", [byte_bpe, metaspace])
@pytest.mark.parametrize("stops", [[], ["wörld"], ["🚀", "界"], ["end"]])
def test_incremental_equals_whole_decode_for_any_split(tmp_path, make, stops):
  tok = make(tmp_path)
  rng = random.Random(0)
  for text in TEXTS[:5]:
    ids = tok.encode(text)
    for _ in range(20):
      cuts = sorted(rng.sample(range(1, len(ids)), k=min(len(ids) - 1, rng.randint(1, 6))))
      steps = [(ids[:c], False) for c in cuts] + [(ids, True)]
      want, want_text = whole_decode_reference(tok, stops, steps)
      stream = TextStream(tok, stops)
      got = []
      for tokens, final in steps:
        got.append(stream.update(tokens, final))
        if got[-1][1] or final:
          break
      assert got == want, (text, cuts)
      assert stream.text == want_text
      assert "".join(d for d, _ in got) == want_text


def test_a_character_split_across_steps_comes_out_once_whole(tmp_path):
  tok = byte_bpe(tmp_path)
  ids = tok.encode("🎉")
  assert len(ids) > 1  # four UTF-8 bytes the small vocabulary did not merge
  stream = TextStream(tok)
  deltas = [stream.update(ids[:i], final=False)[0] for i in range(1, len(ids))]
  assert "".join(deltas) == ""  # nothing half-made is streamed
  assert stream.update(ids, final=False) == ("🎉", False)


def test_a_stop_string_split_across_two_steps_ends_the_text(tmp_path):
  tok = byte_bpe(tmp_path)
  ids = tok.encode("plain ascii words and numbers")
  stop_at = tok.decode(ids).index("words")
  half = next(i for i in range(len(ids)) if len(tok.decode(ids[:i])) > stop_at + 2)
  stream = TextStream(tok, ["words"])
  first, hit = stream.update(ids[:half], final=False)
  assert not hit and "wo" not in first  # "wo..." held back: it may start the stop string
  rest, hit = stream.update(ids, final=False)
  assert hit and first + rest == "plain ascii " and stream.text == "plain ascii "


def test_each_update_decodes_only_the_new_tokens(tmp_path):
  tok = byte_bpe(tmp_path)
  seen = []

  class Counting:
    def decode(self, ids, skip_special=False):
      seen.append(len(ids))
      return tok.decode(ids, skip_special=skip_special)

  ids = tok.encode(" ".join(TEXTS[3:4] * 20))
  stream = TextStream(Counting())
  for i in range(1, len(ids) + 1):
    stream.update(ids[:i], final=i == len(ids))
  assert stream.text == tok.decode(ids)
  assert max(seen) <= 8  # windows of a few tokens, never the whole generation
