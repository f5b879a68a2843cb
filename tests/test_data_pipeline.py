"""The grain pipeline: coverage over hosts, packing, SFT rows, resume, global arrays, errors."""

import collections
import json
import re

import jax
import numpy as np
import pytest

from cardjax.data.pipeline import DataLoader, PipelineSpec, make_dataset, to_global
from cardjax.data.tokenizer import train_bpe
from cardjax.errors import CardjaxError
from cardjax.parallel import make_mesh

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _doc(i: int) -> str:
  rng = np.random.RandomState(i)
  return f"doc {i}: " + " ".join(rng.choice(WORDS, size=rng.randint(3, 12)))


DOCS = [_doc(i) for i in range(60)]
TEXT_SOURCE = [{"text": d.encode()} for d in DOCS]
CHATS = [{"messages": json.dumps([{"role": "user", "content": f"question {i}?"},
                                  {"role": "assistant", "content": _doc(i)}])}
         for i in range(40)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return train_bpe(DOCS + ["question ?"], 300, tmp_path_factory.mktemp("tok"))


def _segments(tok, batches):
  """Every packed segment's text (EOS stripped), over all rows of all batches."""
  out = []
  for b in batches:
    for row_t, row_s in zip(b["tokens"], b["segment_ids"]):
      for seg in sorted(set(row_s.tolist()) - {0}):
        ids = [t for t in row_t[row_s == seg].tolist() if t != tok.eos_id]
        out.append(tok.decode(ids))
  return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_hosts_cover_an_epoch_exactly_once(tok, shuffle):
  spec = PipelineSpec(seq_len=64, batch_size=4, num_epochs=1, shuffle=shuffle, seed=5)
  seen = []
  per_host = []
  for host in (0, 1):
    texts = _segments(tok, make_dataset(TEXT_SOURCE, tok, spec, host, 2))
    per_host.append(set(texts))
    seen += texts
  assert sorted(seen) == sorted(DOCS)  # no duplicates, nothing missing
  assert not per_host[0] & per_host[1]


def test_packing_keeps_every_token_with_right_positions(tok):
  spec = PipelineSpec(seq_len=48, batch_size=2, num_epochs=1, shuffle=False)
  batches = list(make_dataset(TEXT_SOURCE, tok, spec, 0, 1))
  expected = collections.Counter(t for d in DOCS for t in tok.encode(d) + [tok.eos_id])
  got = collections.Counter()
  for b in batches:
    assert b["tokens"].shape == (2, 48) and b["tokens"].dtype == np.int32
    for t, s, p, m in zip(b["tokens"], b["segment_ids"], b["positions"], b["loss_mask"]):
      got.update(t[s > 0].tolist())
      np.testing.assert_array_equal(m, (s > 0).astype(np.int32))
      for seg in set(s.tolist()) - {0}:
        np.testing.assert_array_equal(p[s == seg], np.arange((s == seg).sum()))
  assert got == expected
  assert max(int(b["segment_ids"].max()) for b in batches) > 1  # really packed


def test_pretraining_documents_padded_to_whole_blocks(tok):
  """pad_to_multiple=4 in pretraining: every packed document starts at a multiple of 4
  (the layout splash needs for MARS / BD3LM blocks), its padding is pad_id with no loss,
  and the documents' own tokens are all there."""
  spec = PipelineSpec(seq_len=48, batch_size=2, num_epochs=1, shuffle=False,
                      pad_to_multiple=4)
  batches = list(make_dataset(TEXT_SOURCE, tok, spec, 0, 1))
  got = []
  for b in batches:
    for t, s, p, m in zip(b["tokens"], b["segment_ids"], b["positions"], b["loss_mask"]):
      for seg in set(s.tolist()) - {0}:
        at = np.flatnonzero(s == seg)
        assert at[0] % 4 == 0 and len(at) % 4 == 0, (at, seg)
        np.testing.assert_array_equal(p[at], np.arange(len(at)))
        real = m[at] == 1
        assert real.all() or (t[at][~real] == tok.pad_id).all()
        got.append(tok.decode([x for x in t[at][real].tolist() if x != tok.eos_id]))
  assert sorted(got) == sorted(DOCS)
  assert max(int(b["segment_ids"].max()) for b in batches) > 1  # really packed


def test_long_documents_are_split_not_dropped(tok, caplog, monkeypatch):
  import collections

  from cardjax.data import pipeline
  # The count logs at its 1st, 10th, 100th...: start from zero whatever ran before.
  monkeypatch.setattr(pipeline, "STATS", collections.Counter())
  long = " ".join(DOCS)
  ids = tok.encode(long) + [tok.eos_id]
  spec = PipelineSpec(seq_len=32, batch_size=1, num_epochs=1, shuffle=False)
  with caplog.at_level("WARNING", logger="cardjax.data"):
    batches = list(make_dataset([{"text": long.encode()}], tok, spec, 0, 1))
  rows = [b["tokens"][0][b["segment_ids"][0] > 0] for b in batches]
  assert np.concatenate(rows).tolist() == ids
  assert len(rows) == -(-len(ids) // 32)
  assert "documents split" in caplog.text


def test_sft_rows_mask_responses_and_pad_to_block(tok):
  spec = PipelineSpec(mode="sft", seq_len=64, batch_size=2, num_epochs=1, shuffle=False,
                      packing=False, pad_to_multiple=8)
  batches = list(make_dataset(CHATS, tok, spec, 0, 1))
  assert sum(int(b["segment_ids"].any(axis=1).sum()) for b in batches) == len(CHATS)
  for b in batches:
    for t, s, m in zip(b["tokens"], b["segment_ids"], b["loss_mask"]):
      n = int((s > 0).sum())
      if not n:
        continue
      assert n % 8 == 0  # EOS-padded to a multiple of the block size
      text = tok.decode(t[:n][m[:n] == 1].tolist())
      assert text.startswith("doc ") and "question" not in text  # the response only
      assert "<|im_end|>" in text and m[n:].sum() == 0
      # The turn ends, then EOS pads the example up to the block boundary.
      assert re.sub(r"(<\|endoftext\|>)*$", "", text).endswith("<|im_end|>\n")


def test_sft_packing_and_overflow(tok, caplog):
  packed = PipelineSpec(mode="sft", seq_len=128, batch_size=2, num_epochs=1, shuffle=False,
                        pad_to_multiple=4)
  rows = [r for b in make_dataset(CHATS, tok, packed, 0, 1) for r in b["segment_ids"]]
  assert max(int(r.max()) for r in rows) > 1
  tight = PipelineSpec(mode="sft", seq_len=16, batch_size=2, num_epochs=1, packing=False,
                       sft_overflow="drop")
  with caplog.at_level("WARNING", logger="cardjax.data"):
    assert list(make_dataset(CHATS, tok, tight, 0, 1)) == []
  assert "conversations dropped" in caplog.text
  # Repeated without end, a split that drops everything is an error, not an endless search.
  endless = PipelineSpec(mode="sft", seq_len=16, batch_size=2, num_epochs=0, packing=False,
                         sft_overflow="drop")
  with pytest.raises(CardjaxError, match="every conversation of the split is dropped.*"
                                         "set data.sft_overflow=truncate"):
    next(iter(make_dataset(CHATS, tok, endless, 0, 1)))
  # Truncated, a prompt that fills seq_len still leaves no response token: truncating is
  # then no fix to suggest.
  prompts_fill = PipelineSpec(mode="sft", seq_len=4, batch_size=2, num_epochs=0,
                              packing=False, sft_overflow="truncate")
  with pytest.raises(CardjaxError, match=r"\(data.sft_overflow='truncate'\); raise "
                                         r"data.seq_len or use a split with shorter prompts") as e:
    next(iter(make_dataset(CHATS, tok, prompts_fill, 0, 1)))
  assert "set data.sft_overflow" not in str(e.value)


@pytest.mark.parametrize("mode,source,workers", [("pretrain", TEXT_SOURCE, 0),
                                                 ("sft", CHATS, 0), ("pretrain", TEXT_SOURCE, 2)])
def test_resume_after_k_batches_continues_with_the_next(tok, mode, source, workers):
  spec = PipelineSpec(mode=mode, seq_len=32, batch_size=2, seed=11, pad_to_multiple=4,
                      num_workers=workers)
  reference = DataLoader(source, tok, spec)
  expected = [next(reference) for _ in range(6)]
  first = DataLoader(source, tok, spec)
  for _ in range(4):
    next(first)
  state = json.loads(json.dumps(first.get_state()))  # it is stored as JSON
  resumed = DataLoader(source, tok, spec)
  resumed.set_state(state)
  for want in expected[4:]:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


def test_global_arrays_on_a_mesh(tok):
  mesh = make_mesh(2, 2, 2)
  spec = PipelineSpec(seq_len=32, batch_size=8)
  local = next(iter(make_dataset(TEXT_SOURCE, tok, spec, 0, 1)))
  batch = to_global(local, mesh)
  for key, value in batch.items():
    assert value.shape == (8, 32)
    assert value.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
    np.testing.assert_array_equal(np.asarray(value), local[key])
  assert batch["tokens"].addressable_shards[0].data.shape == (2, 32)


def test_bad_input_is_one_clear_error(tok):
  with pytest.raises(CardjaxError, match="out of range for model.vocab_size=100"):
    next(iter(make_dataset(TEXT_SOURCE, tok, PipelineSpec(vocab_limit=100), 0, 1)))
  with pytest.raises(CardjaxError, match="split is empty"):
    make_dataset([], tok, PipelineSpec(), 0, 1)
  with pytest.raises(CardjaxError, match="must be > 0 and divide data.seq_len=30"):
    make_dataset(CHATS, tok, PipelineSpec(mode="sft", seq_len=30, pad_to_multiple=4), 0, 1)
  with pytest.raises(CardjaxError, match="not divisible by the 3 hosts"):
    make_dataset(TEXT_SOURCE, tok, PipelineSpec(batch_size=4), 0, 3)
  with pytest.raises(CardjaxError, match="data.mode"):
    PipelineSpec(mode="finetune").validate()
