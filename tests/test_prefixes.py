"""Shared prompt prefixes: the PrefixStore learns a prefix two prompts share (in pages),
and a SlotPool row prefilled after a stored prefix decodes the tokens the one-shot decoders
give for the whole prompt."""

import pytest

from cardjax.decoding import ar, mars
from cardjax.errors import CardjaxError
from cardjax.serve.pool.prefixes import PrefixStore, common_length
from cardjax.serve.pool.slots import SlotPool
from decoding_helpers import MASK, tiny_model

N = 8
SYSTEM = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 32, 38, 4, 6, 26, 43, 38, 32, 7]  # 20 tokens
TAILS = [[50, 2], [28, 41, 9, 7, 1], [11], [44, 12, 60, 17, 2, 2, 30, 1, 5]]


def test_store_learns_pages_of_a_shared_prefix_and_keeps_the_recent_ones():
  store = PrefixStore(tiny_model(), page=8, entries=2)
  assert common_length([1, 2, 3], [1, 2, 4]) == 2
  store.learn(SYSTEM + TAILS[0])
  assert not store.entries  # nothing to compare with yet
  store.learn(SYSTEM + TAILS[1])  # 20 shared tokens: a 16-token entry (2 pages)
  assert list(store.entries) == [tuple(SYSTEM[:16])]
  assert store.find(SYSTEM + TAILS[2]) == tuple(SYSTEM[:16])
  assert store.find(SYSTEM[:16]) == ()  # a prefix must leave a token after it
  assert store.find(SYSTEM[:15] + [0, 1]) == ()
  cache = store.cache(tuple(SYSTEM[:16]))
  assert cache.slots == 16 and int(cache.index) == 16
  store.learn([1, 2, 3, 4, 5, 6, 7, 8, 9])  # shares nothing: no entry
  store.learn([1, 2, 3, 4, 5, 6, 7, 8, 10])  # 8 shared, and a token after them
  store.learn([1, 2, 3, 4, 5, 6, 7, 8])  # the 8 are its whole prompt: no 8-token entry
  store.add([9] * 8)  # a third entry: the least recently used one goes
  assert list(store.entries) == [(1, 2, 3, 4, 5, 6, 7, 8), (9,) * 8]
  off = PrefixStore(tiny_model(), page=0)
  off.learn(SYSTEM + TAILS[0])
  off.learn(SYSTEM + TAILS[1])
  assert not off.entries
  with pytest.raises(CardjaxError, match="page=-1 must be >= 0"):
    PrefixStore(tiny_model(), page=-1)


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_rows_after_a_stored_prefix_decode_what_the_whole_prompt_does(method):
  model = tiny_model()
  kw = dict(block=3) if method == "mars" else {}
  pool = SlotPool(model, method, slots=64, batch_sizes=(1, 4), prefix_page=8, span_min=8,
                  **kw)
  prompts = [SYSTEM + tail for tail in TAILS]
  # The first admit learns SYSTEM[:16] from its first two prompts; all four use it.
  assert pool.admit_many((i, p, 0.6, N) for i, p in enumerate(prompts[:3])) == 3 * 16
  assert set(pool.programs.used) == {(4, 16, 16)}  # 3 rows (padded to 4) after 16 cached
  new, _, _ = pool.step(N)
  assert pool.admit_many([(3, prompts[3], 0.6, N)]) == 16
  assert set(pool.programs.used) == {(4, 16, 16), (1, 16, 16)}
  more, _, _ = pool.step(N)
  new[3] = more[3]
  for i, p in enumerate(prompts):
    if method == "ar":
      want = ar.generate(model, [p], N).rows()[0]
    else:
      want = mars.generate(model, [p], N, block=3, tau=0.6, mask_id=MASK).rows()[0]
    assert new[i] == want, i
  # Off: the same prompts prefill whole.
  pool = SlotPool(model, method, slots=64, batch_sizes=(1, 4), prefix_page=0, **kw)
  assert pool.admit_many((i, p, 0.6, N) for i, p in enumerate(prompts)) == 0
  assert {key[1] for key in pool.programs.used} == {0}
