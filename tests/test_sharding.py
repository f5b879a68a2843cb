"""A 2 data x 2 fsdp x 2 tensor mesh on 8 host CPU devices: parameters are really sharded,
and the sharded forward equals the single-device one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import cardjax.hf
from cardjax.errors import ConfigError
from cardjax.model import ModelConfig, create_model
from cardjax.parallel import (DEFAULT_RULES, constrain, logical_to_spec, make_mesh, mesh_shape,
                              use_rules)
from conftest import PARITY_ATOL, max_abs_diff, random_tokens, torch_logits

MESH_SHAPE = {"data": 2, "fsdp": 2, "tensor": 2}
CFG = ModelConfig(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_layers=2, num_heads=4, num_kv_heads=2, initializer_range=0.2)
HF_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
BATCH, SEQ = 4, 16


def assert_same_logits(got, expected):
  """Sharded vs single-device fp32 logits: 1e-5 relative to the largest logit (|logit| <= ~7
  here; partitioned reductions sum in another order, which moves the last ~16 ulps)."""
  scale = max(1.0, float(np.abs(expected).max()))
  diff = max_abs_diff(got, expected)
  assert diff < 1e-5 * scale, f"max |diff| {diff} (max |logit| {scale})"


@pytest.fixture(scope="module")
def mesh(num_devices):
  mesh = make_mesh(2, 2, 2)
  assert dict(mesh.shape) == MESH_SHAPE
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  return mesh


@pytest.fixture(scope="module")
def tokens():
  return random_tokens(CFG.vocab_size, BATCH, SEQ, seed=11)


def _params(model) -> dict[str, jax.Array]:
  flat = jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
  return {jax.tree_util.keystr(path, simple=True, separator="."): v.get_value()
          for path, v in flat}


@nnx.jit
def _forward(model, tokens, positions, segment_ids):
  return model(tokens, positions=positions, segment_ids=segment_ids)


def _packed_meta():
  """Rows 0 and 2 hold two documents each (positions restart, segment ids 1 and 2)."""
  positions = np.tile(np.arange(SEQ), (BATCH, 1))
  segments = np.ones((BATCH, SEQ), np.int32)
  positions[0, 6:] = np.arange(SEQ - 6)
  segments[0, 6:] = 2
  positions[2, 11:] = np.arange(SEQ - 11)
  segments[2, 11:] = 2
  return positions.astype(np.int32), segments


def _sharded_forward(model, mesh, tokens):
  positions, segments = _packed_meta()
  batch = NamedSharding(mesh, P(("data", "fsdp")))
  with jax.set_mesh(mesh):
    args = [jax.device_put(jnp.asarray(a, jnp.int32), batch) for a in (tokens, positions,
                                                                        segments)]
    out = _forward(model, *args)
  assert out.sharding.spec == P(("data", "fsdp"), None, "tensor")
  return np.asarray(out)


def _single_forward(model, tokens):
  """The same jitted forward on one device, no mesh."""
  positions, segments = _packed_meta()
  out = _forward(model, *(jnp.asarray(a, jnp.int32) for a in (tokens, positions, segments)))
  assert len(out.sharding.device_set) == 1
  return np.asarray(out)


def _single_device_copy(model):
  """The same parameters, gathered onto one device."""
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.device_put(state, jax.devices()[0]))


def _assert_sharded_like_rules(model, mesh):
  """Every parameter lives on the mesh with the expected spec and only a slice per device."""
  params = _params(model)
  scan = model.cfg.scan_layers
  kv_spec = "tensor" if model.cfg.num_kv_heads % 2 == 0 else None
  lead = (None,) if scan else ()
  layer = "layers" if scan else "layers.0"
  expected = {
      "embed": P("tensor", "fsdp"),
      "final_norm.scale": P("fsdp"),
      f"{layer}.attn.q": P(*lead, "fsdp", "tensor", None),
      f"{layer}.attn.k": P(*lead, "fsdp", kv_spec, None),
      f"{layer}.attn.v": P(*lead, "fsdp", kv_spec, None),
      f"{layer}.attn.o": P(*lead, "tensor", None, "fsdp"),
      f"{layer}.attn.q_bias": P(*lead, "tensor", None),
      f"{layer}.attn.k_bias": P(*lead, kv_spec, None),
      f"{layer}.mlp.gate": P(*lead, "fsdp", "tensor"),
      f"{layer}.mlp.up": P(*lead, "fsdp", "tensor"),
      f"{layer}.mlp.down": P(*lead, "tensor", "fsdp"),
      f"{layer}.attn_norm.scale": P(*lead, "fsdp"),
  }
  if not model.cfg.tie_word_embeddings:
    expected["lm_head"] = P("tensor", "fsdp")
  for name, spec in expected.items():
    array = params[name]
    assert isinstance(array.sharding, NamedSharding), name
    assert array.sharding.mesh.shape == mesh.shape, name
    assert array.sharding.spec == spec, f"{name}: {array.sharding.spec} != {spec}"
  for name, array in params.items():
    assert len(array.sharding.device_set) == 8, name
    local = array.addressable_shards[0].data.shape
    factor = np.prod(array.shape) // np.prod(local)
    sharded_dims = sum(s is not None for s in array.sharding.spec)
    assert factor == 2 ** sharded_dims, (name, array.shape, local, array.sharding.spec)
  # The big matrices are split 4 ways (fsdp x tensor) on every device.
  assert params["embed"].addressable_shards[0].data.shape == (128, 32)
  q = params[f"{layer}.attn.q"]
  assert q.addressable_shards[0].data.shape == (*((2,) if scan else ()), 32, 2, 16)


def test_create_model_on_mesh(mesh, tokens):
  """Same seed, same model: the mesh only decides where each parameter lives."""
  sharded = create_model(CFG, seed=5, mesh=mesh)
  single = create_model(CFG, seed=5)
  _assert_sharded_like_rules(sharded, mesh)
  ps, p1 = _params(sharded), _params(single)
  assert sorted(ps) == sorted(p1)
  for name in ps:
    assert ps[name].shape == p1[name].shape
    assert len(p1[name].sharding.device_set) == 1
    # The sharded init runs under jit, the single-device one eagerly: XLA's fusion may move
    # the last bit of a normal sample.
    np.testing.assert_allclose(np.asarray(ps[name]), np.asarray(p1[name]), atol=1e-6, rtol=0,
                               err_msg=name)
  expected = _single_forward(single, tokens)
  assert np.std(expected) > 0.1
  assert_same_logits(_sharded_forward(sharded, mesh, tokens), expected)


@pytest.mark.parametrize("scan,kv_heads", [(True, 1)])
def test_sharded_variants(mesh, tokens, scan, kv_heads):
  """Stacked (scanned) layers gain a replicated leading 'layers' dim; kv_heads=1 cannot
  split over tensor=2, so that dimension falls back to replicated."""
  cfg = ModelConfig(**{**CFG.to_dict(), "scan_layers": scan, "num_kv_heads": kv_heads})
  sharded = create_model(cfg, seed=6, mesh=mesh)
  _assert_sharded_like_rules(sharded, mesh)
  k = _params(sharded)["layers.attn.k" if scan else "layers.0.attn.k"]
  kv_spec = "tensor" if kv_heads == 2 else None
  assert k.sharding.spec == P(*((None,) if scan else ()), "fsdp", kv_spec, None)
  assert k.addressable_shards[0].data.shape == (*((2,) if scan else ()), 32, 1, 16)
  expected = _single_forward(_single_device_copy(sharded), tokens)
  assert_same_logits(_sharded_forward(sharded, mesh, tokens), expected)


@pytest.fixture(scope="module")
def hf_folder(hf_model_factory):
  return hf_model_factory("qwen2", seed=51, **HF_CONFIG)


def test_from_pretrained_on_mesh(mesh, tokens, hf_folder):
  path, torch_model = hf_folder
  sharded = cardjax.hf.from_pretrained(path, mesh=mesh)
  single = cardjax.hf.from_pretrained(path)
  assert sharded.cfg == single.cfg and not sharded.cfg.tie_word_embeddings
  _assert_sharded_like_rules(sharded, mesh)
  ps, p1 = _params(sharded), _params(single)
  for name in p1:
    np.testing.assert_array_equal(np.asarray(ps[name]), np.asarray(p1[name]), err_msg=name)

  expected = _single_forward(single, tokens)
  got = _sharded_forward(sharded, mesh, tokens)
  assert_same_logits(got, expected)
  # And both are still transformers' logits (row 1 is one unpacked document).
  ref = torch_logits(torch_model, tokens[1:2])
  assert max_abs_diff(got[1:2], ref) < PARITY_ATOL


def test_from_pretrained_uses_the_set_mesh(mesh, hf_folder):
  path, _ = hf_folder
  with jax.set_mesh(mesh):
    model = cardjax.hf.from_pretrained(path)
  _assert_sharded_like_rules(model, mesh)


def test_sharded_export_roundtrip(mesh, hf_folder, tmp_path):
  """save_pretrained gathers sharded parameters: the export equals the source exactly."""
  from safetensors.numpy import load_file

  path, _ = hf_folder
  model = cardjax.hf.from_pretrained(path, mesh=mesh, scan_layers=True)
  out = cardjax.hf.save_pretrained(model, tmp_path / "export")
  original = load_file(str(path / "model.safetensors"))
  exported = load_file(str(out / "model.safetensors"))
  assert sorted(original) == sorted(exported)
  for key in original:
    np.testing.assert_array_equal(exported[key], original[key], err_msg=key)


# --- mesh_shape ---------------------------------------------------------------------------

@pytest.mark.parametrize("args,n,want", [
    ((2, 2, 2), 8, (2, 2, 2)),
    ((2, -1, 2), 8, (2, 2, 2)),
    ((-1, 1, 1), 8, (8, 1, 1)),
    ((1, -1, 1), 8, (1, 8, 1)),
    ((1, 2, -1), 8, (1, 2, 4)),
    ((1, -1, 1), 1, (1, 1, 1)),
    ((3, -1, 1), 6, (3, 2, 1)),
])
def test_mesh_shape(args, n, want):
  assert mesh_shape(*args, num_devices=n) == want


def test_mesh_shape_defaults_to_all_devices(num_devices):
  assert mesh_shape() == (1, num_devices, 1)
  assert mesh_shape(data=2, tensor=2) == (2, 2, 2)


@pytest.mark.parametrize("args,n,fragment", [
    ((-1, -1, 1), 8, "at most one axis"),
    ((2, 0, 2), 8, "mesh.fsdp=0"),
    ((-2, 1, 1), 8, "mesh.data=-2"),
    ((3, -1, 1), 8, "not divisible by 3"),
    ((2, 2, 1), 8, "needs 4 devices"),
    ((2, 2, 4), 8, "needs 16 devices"),
])
def test_mesh_shape_errors(args, n, fragment):
  with pytest.raises(ConfigError) as info:
    mesh_shape(*args, num_devices=n)
  assert fragment in str(info.value)


def test_make_mesh_on_a_device_subset(num_devices):
  mesh = make_mesh(2, -1, 1, devices=jax.devices()[:4])
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 1}
  assert mesh.devices.size == 4
  with pytest.raises(ConfigError):
    make_mesh(4, 4, 1)


# --- logical_to_spec ----------------------------------------------------------------------

def test_logical_to_spec_without_a_mesh():
  assert logical_to_spec(("vocab", "embed")) == P("tensor", "fsdp")
  assert logical_to_spec(("embed", "heads", "head_dim")) == P("fsdp", "tensor", None)
  assert logical_to_spec(("act_batch", "act_seq", None)) == P(("data", "fsdp"), None, None)


def test_logical_to_spec_divisibility_fallback():
  assert logical_to_spec(("vocab", "embed"), (256, 64), MESH_SHAPE) == P("tensor", "fsdp")
  # vocab 257 does not split over tensor=2: that dim replicates, embed still shards.
  assert logical_to_spec(("vocab", "embed"), (257, 64), MESH_SHAPE) == P(None, "fsdp")
  assert logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 1, 16),
                         MESH_SHAPE) == P("fsdp", None, None)
  # A multi-axis rule keeps the longest prefix of its axes whose product divides the dim.
  assert logical_to_spec(("act_batch",), (4,), MESH_SHAPE) == P(("data", "fsdp"))
  assert logical_to_spec(("act_batch",), (2,), MESH_SHAPE) == P("data")
  assert logical_to_spec(("act_batch",), (6,), MESH_SHAPE) == P("data")
  assert logical_to_spec(("act_batch",), (3,), MESH_SHAPE) == P(None)


def test_logical_to_spec_unused_and_reused_axes():
  # Mesh axes the mesh does not have are dropped.
  assert logical_to_spec(("vocab", "embed"), (256, 64), {"data": 8}) == P(None, None)
  assert logical_to_spec(("act_batch",), (8,), {"data": 8}) == P("data")
  assert logical_to_spec(("act_batch",), (8,), {"fsdp": 4, "tensor": 2}) == P("fsdp")
  # One mesh axis is used once per array: the second 'tensor' dim replicates ...
  assert logical_to_spec(("heads", "mlp"), (4, 128), MESH_SHAPE) == P("tensor", None)
  # ... unless the first could not take it.
  assert logical_to_spec(("heads", "mlp"), (3, 128), MESH_SHAPE) == P(None, "tensor")


def test_logical_to_spec_unknown_name():
  with pytest.raises(ValueError, match="'mystery'"):
    logical_to_spec(("embed", "mystery"))


def test_custom_rules():
  rules = [("vocab", None), ("embed", ("fsdp", "tensor"))]
  assert logical_to_spec(("vocab", "embed"), (256, 64), MESH_SHAPE,
                         rules=rules) == P(None, ("fsdp", "tensor"))
  with use_rules(rules):
    assert logical_to_spec(("vocab", "embed")) == P(None, ("fsdp", "tensor"))
    with pytest.raises(ValueError, match="'heads'"):
      logical_to_spec(("heads",))
  assert logical_to_spec(("vocab", "embed")) == P("tensor", "fsdp")
  assert dict(DEFAULT_RULES)["vocab"] == "tensor"


def test_constrain_is_a_noop_without_a_mesh():
  x = jnp.ones((4, 8))
  assert constrain(x, ("act_batch", "act_embed")) is x


def test_constrain_under_a_mesh(mesh):
  @jax.jit
  def f(x):
    return constrain(x * 2, ("act_batch", "act_mlp"))

  with jax.set_mesh(mesh):
    y = f(jnp.ones((4, 8)))
  assert y.sharding.spec == P(("data", "fsdp"), "tensor")
  np.testing.assert_array_equal(np.asarray(y), 2.0)
