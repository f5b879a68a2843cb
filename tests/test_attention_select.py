"""attention_impl resolution (cardjax/attention/select.py): auto per platform and mask,
explicit kernels that cannot serve a call fail with the fix, the log names the path, the
config accepts the five names, and the model runs with each that runs on CPU."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import cardjax.attention as attn
from cardjax.attention import CAUSAL, MaskSpec, select
from cardjax.attention.select import AttentionImplError, choose
from cardjax.errors import ConfigError
from cardjax.model import ModelConfig

Q = (2, 256, 4, 64)  # [b, T, heads, head_dim]
K = (2, 256, 2, 64)
BF16 = jnp.bfloat16


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
  """Each test sees every choice logged anew; no interpret mode from the environment."""
  monkeypatch.setattr(select, "_logged", set())
  monkeypatch.delenv(select.INTERPRET_ENV, raising=False)


class FakePallasGpu:
  """Stands in for cardjax/attention/pallas_gpu.py where a test needs to steer it."""

  def __init__(self, reason=None):
    self.reason, self.calls = reason, []

  def unsupported_reason(self, spec, q_len, k_len, head_dim):
    return self.reason

  def pallas_gpu_attention(self, q, k, v, spec, q_meta, k_meta, *, interpret=None,
                           block_q=None, block_k=None, forward="triton"):
    self.calls.append(interpret)
    self.forwards = getattr(self, "forwards", []) + [forward]
    return attn.reference_attention(q, k, v, spec, q_meta, k_meta)


def test_auto_on_cpu_is_xla():
  assert select.current_platform() == "cpu"
  for kind, b in (("causal", 0), ("dual_stream", 4), ("block_causal", 4)):
    assert choose("auto", MaskSpec(kind, b), Q, K) == "xla"


def test_auto_on_tpu_picks_splash_where_it_serves():
  assert choose("auto", MaskSpec("dual_stream", 4), Q, K, platform="tpu") == "splash"
  assert choose("auto", MaskSpec("causal"), Q, K, platform="tpu") == "splash"
  # Cross attention (q over a longer key row) is not splash's: auto takes xla.
  assert choose("auto", MaskSpec("causal"), (2, 8, 4, 64), K, platform="tpu") == "xla"


def test_auto_on_gpu(monkeypatch):
  fake = FakePallasGpu()
  monkeypatch.setattr(select, "_pallas_gpu", lambda: fake)
  for kind in ("dual_stream", "bd3lm", "block_causal"):
    assert choose("auto", MaskSpec(kind, 4), Q, K, BF16, platform="gpu") == "pallas_gpu"
  # Plain masks: cuDNN where it serves them (bf16, head_dim <= 128), else the Pallas kernel.
  assert choose("auto", MaskSpec("causal"), Q, K, BF16, platform="gpu") == "cudnn"
  assert choose("auto", MaskSpec("bidirectional"), Q, K, BF16, platform="gpu") == "cudnn"
  assert choose("auto", MaskSpec("causal"), Q, K, jnp.float32, platform="gpu") == "pallas_gpu"
  fake.reason = "head_dim 96 is not one of (16, 32, 64, 128)"
  assert choose("auto", MaskSpec("dual_stream", 4), Q, K, BF16, platform="gpu") == "xla"


def test_explicit_kernels_off_their_platform_fail_with_the_fix():
  spec = MaskSpec("causal")
  with pytest.raises(AttentionImplError, match=r"splash runs on TPU.*INTERPRET.*"
                                               r"attention_impl=xla"):
    choose("splash", spec, Q, K)
  with pytest.raises(AttentionImplError, match="cudnn runs on GPU.*attention_impl=xla"):
    choose("cudnn", spec, Q, K, BF16)
  with pytest.raises(AttentionImplError, match="pallas_gpu runs on GPU"):
    choose("pallas_gpu", spec, Q, K)
  # cuDNN has no interpret mode: still an error on CPU.
  with pytest.raises(AttentionImplError, match="cudnn runs on GPU"):
    choose("cudnn", spec, Q, K, BF16, interpret=True)


def test_interpret_mode_by_argument_or_environment(monkeypatch):
  spec = MaskSpec("causal")
  assert choose("splash", spec, Q, K, interpret=True) == "splash"
  monkeypatch.setenv(select.INTERPRET_ENV, "1")
  assert choose("splash", spec, Q, K) == "splash"
  fake = FakePallasGpu()
  monkeypatch.setattr(select, "_pallas_gpu", lambda: fake)
  assert choose("pallas_gpu", spec, Q, K) == "pallas_gpu"
  # ...and the kernel is called in interpret mode.
  q, k, v = (jnp.ones((1, 8, 2, 16)),) * 3
  meta = (jnp.arange(8)[None], jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32))
  attn.attend(q, k, v, spec, meta, meta, impl="pallas_gpu")
  assert fake.calls == [True]


def test_impossible_combinations_name_the_reason_and_fix(monkeypatch):
  with pytest.raises(AttentionImplError, match="cuDNN serves.*not 'dual_stream'.*"
                                               "attention_impl=xla"):
    choose("cudnn", MaskSpec("dual_stream", 4), Q, K, BF16, platform="gpu")
  with pytest.raises(AttentionImplError, match="bfloat16 or float16"):
    choose("cudnn", MaskSpec("causal"), Q, K, jnp.float32, platform="gpu")
  with pytest.raises(AttentionImplError, match="head_dim a multiple of 8 up to 128"):
    choose("cudnn", MaskSpec("causal"), (2, 256, 4, 200), (2, 256, 2, 200), BF16,
           platform="gpu")
  with pytest.raises(AttentionImplError, match="splash serves self-attention"):
    choose("splash", MaskSpec("causal"), (2, 8, 4, 64), K, platform="tpu")
  with pytest.raises(AttentionImplError, match="even row"):
    choose("splash", MaskSpec("bd3lm", 4), (2, 255, 4, 64), (2, 255, 2, 64), platform="tpu")
  fake = FakePallasGpu("head_dim 96 is not one of (16, 32, 64, 128)")
  monkeypatch.setattr(select, "_pallas_gpu", lambda: fake)
  with pytest.raises(AttentionImplError, match="head_dim 96.*attention_impl=xla"):
    choose("pallas_gpu", MaskSpec("dual_stream", 4), Q, K, platform="gpu")
  with pytest.raises(AttentionImplError, match="unknown attention implementation 'flash'"):
    choose("flash", MaskSpec("causal"), Q, K)


def test_log_names_the_path_once_per_choice(caplog):
  caplog.set_level(logging.INFO, logger="cardjax.attention")
  for _ in range(3):
    choose("auto", MaskSpec("causal"), Q, K)
  choose("auto", MaskSpec("dual_stream", 4), Q, K, platform="tpu")
  choose("splash", MaskSpec("causal"), Q, K, interpret=True)
  lines = [r.getMessage() for r in caplog.records if r.name == "cardjax.attention"]
  assert lines == [
      "attention: xla runs causal masks on cpu (attention_impl=auto)",
      "attention: splash runs dual_stream masks on tpu (attention_impl=auto)",
      "attention: splash runs causal masks on cpu (interpret mode) (attention_impl=splash)"]


def test_platform_follows_the_mesh():
  """`cardjax plan` traces on a CPU process for TPU devices: the mesh decides."""
  from cardjax.parallel import make_mesh

  mesh = make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2])
  with jax.set_mesh(mesh):
    assert select.current_platform() == "cpu"


def test_auto_compiles_splash_for_a_compile_only_tpu_slice(caplog):
  """The tiny MARS step with attention_impl=auto, planned for v5p-8 (libtpu's compile-only
  devices, from this CPU process): auto picks splash for the dual-stream mask and libtpu
  compiles the kernel, forward and backward, inside the sharded train step."""
  from cardjax.config import load_config
  from cardjax.plan import run_plan

  caplog.set_level(logging.INFO, logger="cardjax.attention")
  config = load_config("configs/tiny_mars.py", ["--config.model.attention_impl=auto"])
  plans = run_plan(config, "v5p-8", search=False)
  assert plans[0].fits and plans[0].temp > 0
  assert ("attention: splash runs dual_stream masks on tpu (attention_impl=auto)"
          in [r.getMessage() for r in caplog.records])


def test_config_accepts_the_five_names():
  for impl in ("auto", "xla", "splash", "pallas_gpu", "cudnn"):
    assert ModelConfig(attention_impl=impl).validate().attention_impl == impl
  with pytest.raises(ConfigError, match=r"attention_impl='flash'.*auto.*cudnn"):
    ModelConfig(attention_impl="flash").validate()


def test_model_with_auto_and_interpreted_splash_equals_xla(monkeypatch, caplog):
  """The decoder's forward (training path) with auto (-> xla on CPU) and with splash in
  interpret mode gives xla's logits on real tokens; splash's cached forward runs xla's
  cache_attention (no TPU kernel reads the cache's layout) and says so in the log."""
  from cardjax.model import create_model

  caplog.set_level(logging.INFO, logger="cardjax.attention")
  base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
              num_heads=2, num_kv_heads=1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (1, 24)), jnp.int32)
  segs = jnp.asarray([[1] * 10 + [2] * 14], jnp.int32)
  pos = jnp.asarray([list(range(10)) + list(range(14))], jnp.int32)
  outs = {}
  monkeypatch.setenv(select.INTERPRET_ENV, "1")
  for impl in ("xla", "auto", "splash"):
    model = create_model(ModelConfig(attention_impl=impl, **base), seed=0)
    # jit: interpret mode walks the kernel's grid op by op when eager (minutes on CPU).
    forward = nnx.jit(lambda m, t, p, g: m(t, positions=p, segment_ids=g))
    outs[impl] = np.asarray(forward(model, tokens, pos, segs))
  np.testing.assert_array_equal(outs["auto"], outs["xla"])
  np.testing.assert_allclose(outs["splash"], outs["xla"], atol=1e-5)
  from cardjax.model.cache import KVCache

  model = create_model(ModelConfig(attention_impl="splash", **base), seed=0)
  logits, _ = model.forward_cached(tokens[:, :8], KVCache.create(model.cfg, 1, 32))
  want, _ = create_model(ModelConfig(**base), seed=0).forward_cached(
      tokens[:, :8], KVCache.create(model.cfg, 1, 32))
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(want))
  assert any("cached decoding forwards run xla" in r.getMessage()
             and "attention_impl=splash" in r.getMessage() for r in caplog.records)


def test_splash_cached_forward_runs_tpu_decode_in_interpret_mode(monkeypatch, caplog):
  """A 128-wide-head model with attention_impl=splash, interpreted on CPU: its cached
  forwards (a prefill, then one step) run tpu_decode and give xla's logits."""
  from cardjax.model import create_model
  from cardjax.model.cache import KVCache

  caplog.set_level(logging.INFO, logger="cardjax.attention")
  monkeypatch.setenv(select.INTERPRET_ENV, "1")
  base = dict(vocab_size=64, hidden_size=256, intermediate_size=64, num_layers=1,
              num_heads=2, num_kv_heads=1)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 9)), jnp.int32)
  got = []
  for impl in ("splash", "xla"):
    model = create_model(ModelConfig(attention_impl=impl, **base), seed=0)

    @nnx.jit
    def run(m, t):
      logits, cache = m.forward_cached(t[:, :8], KVCache.create(m.cfg, 2, 140))
      step, _ = m.forward_cached(t[:, 8:], cache, positions=jnp.full((2, 1), 8))
      return logits, step
    got.append([np.asarray(x) for x in run(model, tokens)])
  for kernel_out, xla_out in zip(*got):
    np.testing.assert_allclose(kernel_out, xla_out, atol=1e-4, rtol=1e-4)
  assert any("cached decoding forwards run tpu_decode" in r.getMessage()
             for r in caplog.records)


@pytest.mark.parametrize("impl, platform, interpret, head_dim, want", [
    ("xla", "gpu", False, 64, "xla"),
    ("auto", "cpu", False, 64, "xla"),
    ("auto", "tpu", False, 64, "xla"),  # 64-wide heads: tpu_decode would relay the cache
    ("auto", "tpu", False, 128, "tpu_decode"),
    ("auto", "gpu", False, 64, "pallas_decode"),
    ("auto", "gpu", False, 24, "xla"),  # a head dim the kernel does not tile
    ("splash", "tpu", False, 64, "xla"),
    ("splash", "tpu", False, 128, "tpu_decode"),
    ("splash", "cpu", True, 256, "tpu_decode"),
    ("splash", "cpu", False, 128, "xla"),
    ("pallas_gpu", "gpu", False, 64, "pallas_decode"),
    ("pallas_gpu", "cpu", True, 64, "pallas_decode"),
    ("cudnn", "gpu", False, 128, "pallas_decode"),
])
def test_cached_forward_path(impl, platform, interpret, head_dim, want):
  spec = MaskSpec("dual_stream", 4)
  got = select.cached_choose(impl, spec, (2, 8, 4, head_dim), 100, jnp.bfloat16,
                             platform=platform, interpret=interpret)
  assert got == want


@pytest.mark.parametrize("impl, platform, head_dim, match", [
    ("pallas_gpu", "cpu", 64, r"pallas_decode, a GPU kernel; this is CPU.*INTERPRET"),
    ("cudnn", "tpu", 64, r"this is TPU"),
    ("pallas_gpu", "gpu", 24, r"head_dim 24"),
])
def test_cached_forward_kernel_that_cannot_serve_is_an_error(impl, platform, head_dim, match):
  with pytest.raises(AttentionImplError, match=match + r".*attention_impl=xla"):
    select.cached_choose(impl, CAUSAL, (1, 1, 4, head_dim), 64, platform=platform,
                         interpret=False)


def test_the_hopper_forward_is_chosen_only_explicitly_and_only_where_it_serves(monkeypatch):
  """pallas_mgpu: bf16 / fp16 and head dims 64, 128 on a GPU, else one error with the fix;
  `auto` keeps to its measured table, which does not list it yet."""
  fake = FakePallasGpu()
  monkeypatch.setattr(select, "_pallas_gpu", lambda: fake)
  spec = MaskSpec("dual_stream", 4)
  assert choose("pallas_mgpu", spec, Q, K, BF16, platform="gpu") == "pallas_mgpu"
  assert "pallas_mgpu" not in {impl for order in select.AUTO_GPU.values() for impl in order}
  with pytest.raises(AttentionImplError, match="float32 is not bfloat16"):
    choose("pallas_mgpu", spec, Q, K, jnp.float32, platform="gpu")
  with pytest.raises(AttentionImplError, match="runs on GPU, this is CPU"):
    choose("pallas_mgpu", spec, Q, K, BF16, platform="cpu", interpret=False)
  meta = (jnp.zeros((1, Q[1]), jnp.int32),) * 3
  select.run("pallas_mgpu", jnp.zeros(Q, BF16), jnp.zeros(K, BF16), jnp.zeros(K, BF16), spec,
             meta, meta, interpret=True)
  assert fake.forwards == ["mosaic"]
