"""Batched decoding on a device mesh: the KV cache is sharded (rows over data, kv heads over
tensor) and the tokens equal single-device decoding."""

import jax
import pytest

from cardjax.decoding import generate
from cardjax.decoding import mars
from cardjax.model import create_model
from cardjax.model.cache import KVCache
from cardjax.parallel import make_mesh
from decoding_helpers import CONFIG as CFG, PROMPTS, tiny_model



@pytest.fixture(scope="module")
def mesh():
  return make_mesh(data=4, fsdp=1, tensor=2)


def test_cache_is_sharded_on_the_mesh(mesh):
  with jax.set_mesh(mesh):
    cache = jax.jit(lambda: KVCache.create(CFG, 4, 16))()
  spec = tuple(cache.k.sharding.spec) + (None,) * 5  # PartitionSpec drops trailing Nones
  assert spec[:5] == (None, "data", "tensor", None, None)  # [layers, batch, kv, slots, dim]
  assert cache.segments.sharding.spec[0] == "data"


def test_mesh_decoding_equals_single_device(mesh):
  single = tiny_model()
  want_ar = generate(single, PROMPTS, 10).rows()
  want_mars = mars.generate(single, PROMPTS, 10, block=4, tau=0.5, mask_id=63).rows()
  with jax.set_mesh(mesh):
    model = create_model(CFG, seed=1, mesh=mesh)
    assert generate(model, PROMPTS, 10).rows() == want_ar
    assert mars.generate(model, PROMPTS, 10, block=4, tau=0.5, mask_id=63).rows() == want_mars
