"""Which attention implementation runs a call: `model.attention_impl` resolved per call.

  auto        TPU: splash where it can serve the call, else xla.
              GPU: pallas_gpu for the block and two-stream kinds (dual_stream, bd3lm,
              block_causal); cudnn for causal / bidirectional where cuDNN serves them
              (bf16/fp16, head_dim a multiple of 8 up to 128), else pallas_gpu, else xla.
              CPU (and anything else): xla.
              The compact MARS noisy stream (MaskSpec.noisy_len > 0) is served too:
              on GPU by pallas_gpu (it reads per-token metadata), on TPU by splash,
              which scatters the kept blocks into an aligned [clean | noisy] row for its
              static index mask (cardjax/attention/splash_compact.py; attention then
              costs the full copy's 2L row, only the MLP and projections keep the saving).
  xla         cardjax/attention/xla.py (dense reference, structured two-stream path).
  splash      cardjax/attention/splash.py, TPU only (or interpret mode).
  pallas_gpu  cardjax/attention/pallas_gpu.py, GPU only (or interpret mode).
  pallas_mgpu the Hopper kernels of cardjax/attention/pallas_mgpu.py (forward) and
              pallas_mgpu_bwd.py (dq, dk/dv): Mosaic GPU, TMA, wgmma, warp-specialized;
              bf16/fp16, head_dim 64 or 128; sm_90 GPUs only (or interpret mode). `auto`
              does not pick it until a GPU measurement puts it in AUTO_GPU.
  cudnn       jax.nn.dot_product_attention(implementation="cudnn"), GPU only; causal and
              bidirectional; packed documents go in as a boolean [b, 1, T, T] mask.

An explicitly chosen kernel that cannot serve a call is an error naming why and the fix
(`--config.model.attention_impl=xla` or `auto`), never a silent switch to another path;
only `auto` chooses, and it says what it chose. Each distinct choice (requested impl,
chosen path, mask kind, platform) is logged once on the "cardjax.attention" logger.

The platform is the active mesh's (jax.set_mesh), else jax's default backend: `cardjax
plan` compiles for compile-only TPU devices from a CPU process, and its step must get the
TPU path.

Interpret mode (the Pallas kernels on CPU, slow, for tests and debugging): pass
interpret=True to `attend`, or set the environment variable CARDJAX_ATTENTION_INTERPRET=1
for a whole run (`cardjax train`, `cardjax generate`); read when attention is traced.
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp

from cardjax.attention.masks import MaskSpec
from cardjax.errors import CardjaxError

log = logging.getLogger("cardjax.attention")

IMPLEMENTATIONS = ("auto", "xla", "splash", "pallas_gpu", "pallas_mgpu", "cudnn")
KERNEL_PLATFORM = {"splash": "tpu", "pallas_gpu": "gpu", "pallas_mgpu": "gpu", "cudnn": "gpu"}
INTERPRET_ENV = "CARDJAX_ATTENTION_INTERPRET"
BLOCK_OR_TWO_STREAM = ("dual_stream", "bd3lm", "block_causal")
CUDNN_KINDS = ("causal", "bidirectional")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
FIX = "set --config.model.attention_impl=xla (or auto)"

_logged: set = set()


class AttentionImplError(CardjaxError, ValueError):
  """The configured attention implementation cannot run this call."""


def interpret_requested(interpret: bool | None = None) -> bool:
  """The call's interpret flag, else the CARDJAX_ATTENTION_INTERPRET environment variable."""
  if interpret is not None:
    return bool(interpret)
  return os.environ.get(INTERPRET_ENV, "").strip().lower() in ("1", "true", "yes")


def current_platform() -> str:
  """'tpu', 'gpu' or 'cpu': the active mesh's devices, else jax's default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  platform = None
  if not mesh.empty:
    platform = getattr(getattr(mesh, "abstract_device", None), "platform", None)
  platform = (platform or jax.default_backend()).lower()
  return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def _kernel(name: str):
  """The Pallas kernel module cardjax/attention/{name}.py (pallas_gpu, pallas_decode),
  imported on first use: a jax without Pallas's Triton module fails here, with the fix."""
  import importlib
  try:
    return importlib.import_module(f"cardjax.attention.{name}")
  except ImportError as e:
    raise AttentionImplError(f"cardjax/attention/{name}.py cannot be imported ({e}); "
                             f"{FIX}") from None


def _pallas_gpu():
  return _kernel("pallas_gpu")


def _cudnn_reason(spec: MaskSpec, q_len: int, k_len: int, head_dim: int, dtype) -> str | None:
  if spec.kind not in CUDNN_KINDS:
    return f"cuDNN serves {CUDNN_KINDS} masks, not {spec.kind!r}"
  if q_len != k_len:
    return f"cuDNN here serves self-attention; got {q_len} queries over {k_len} keys"
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
    return f"cuDNN flash attention needs bfloat16 or float16, got {jnp.dtype(dtype).name}"
  if head_dim % 8 or head_dim > 128:
    return f"cuDNN flash attention needs head_dim a multiple of 8 up to 128, got {head_dim}"
  return None


def unsupported_reason(impl: str, spec: MaskSpec, q_len: int, k_len: int, head_dim: int,
                       dtype, platform: str, interpret: bool) -> str | None:
  """Why a concrete implementation cannot serve this call here (None when it can)."""
  if impl == "xla":
    return None
  want = KERNEL_PLATFORM[impl]
  if platform != want and not (interpret and impl != "cudnn"):
    how = "" if impl == "cudnn" else (
        f" (or interpret mode, slow: {INTERPRET_ENV}=1 or attend(..., interpret=True))")
    return f"{impl} runs on {want.upper()}, this is {platform.upper()}{how}"
  if impl == "splash":
    from cardjax.attention import splash
    return splash.unsupported_reason(spec, q_len, k_len, head_dim)
  if impl == "pallas_gpu":
    return _pallas_gpu().unsupported_reason(spec, q_len, k_len, head_dim)
  if impl == "pallas_mgpu":
    return (_pallas_gpu().unsupported_reason(spec, q_len, k_len, head_dim)
            or _kernel("pallas_mgpu").unsupported_reason(spec, q_len, k_len, head_dim, dtype))
  return _cudnn_reason(spec, q_len, k_len, head_dim, dtype)


# What `auto` tries on a GPU, per mask kind, fastest first as measured: one NVIDIA H200,
# bf16, d 128, 2026-12-04 (results/kernels/attention_gpu_h200_2026-12-04.md): cuDNN's
# causal kernel beats pallas_gpu on the kinds it serves; pallas_gpu beats cuDNN with a
# dense mask 1.85-4.06x on the others. pallas_mgpu joins where a GPU run measures it faster.
AUTO_GPU = {kind: ("pallas_gpu",) for kind in BLOCK_OR_TWO_STREAM}
AUTO_GPU.update({kind: ("cudnn", "pallas_gpu") for kind in CUDNN_KINDS})


def _auto(spec, q_len, k_len, head_dim, dtype, platform) -> str:
  if platform == "tpu":
    order = ("splash",)
  elif platform == "gpu":
    order = AUTO_GPU[spec.kind]
  else:
    order = ()
  for impl in order:
    if unsupported_reason(impl, spec, q_len, k_len, head_dim, dtype, platform, False) is None:
      return impl
  return "xla"


def choose(impl: str, spec: MaskSpec, q_shape, k_shape, dtype=jnp.float32, *,
           platform: str | None = None, interpret: bool | None = None) -> str:
  """The concrete implementation for a call (q [b, Tq, h, d], k [b, Tk, kvh, d]); raises
  AttentionImplError when an explicit choice cannot serve it. Logs each distinct choice."""
  if impl not in IMPLEMENTATIONS:
    raise AttentionImplError(f"unknown attention implementation {impl!r}; expected one of "
                             f"{IMPLEMENTATIONS}")
  platform = platform or current_platform()
  interpret = interpret_requested(interpret)
  q_len, k_len, head_dim = q_shape[1], k_shape[1], q_shape[-1]
  if impl == "auto":
    chosen = _auto(spec, q_len, k_len, head_dim, dtype, platform)
  else:
    reason = unsupported_reason(impl, spec, q_len, k_len, head_dim, dtype, platform,
                                interpret)
    if reason:
      raise AttentionImplError(f"attention_impl={impl} cannot serve {spec.kind} attention "
                               f"of {q_len} queries x {k_len} keys, head_dim {head_dim}: "
                               f"{reason}; {FIX}")
    chosen = impl
  key = (impl, chosen, spec.kind, platform,
         interpret and chosen in ("splash", "pallas_gpu", "pallas_mgpu"))
  if key not in _logged:
    _logged.add(key)
    mode = " (interpret mode)" if key[-1] else ""
    log.info("attention: %s runs %s masks on %s%s (attention_impl=%s)", chosen, spec.kind,
             platform, mode, impl)
  return chosen


def cudnn_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, scale: float | None = None):
  """jax.nn.dot_product_attention through cuDNN: causal/bidirectional by index, documents
  as a boolean segment mask. Under the causal kind it shares splash's layout contract
  (positions increase by 1 with the index inside a segment), checked when concrete."""
  from cardjax.attention import splash

  if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((q_meta, k_meta))):
    splash.check_layout(spec, q_meta, k_meta)
  seg_q, seg_k = q_meta[2], k_meta[2]
  mask = (seg_q[:, :, None] == seg_k[:, None, :])[:, None]  # [b, 1, Tq, Tk]
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale,
                                      is_causal=spec.kind == "causal",
                                      implementation="cudnn")


def run(chosen: str, q, k, v, spec: MaskSpec, q_meta, k_meta, *, interpret: bool | None = None,
        structured: bool = True):
  """Call the implementation `choose` returned (structured: for "xla", whether the
  two-stream kinds take the structured path)."""
  interpret = interpret_requested(interpret)
  if chosen == "xla":
    from cardjax.attention.xla import xla_attention
    return xla_attention(q, k, v, spec, q_meta, k_meta, structured)
  if chosen == "splash":
    from cardjax.attention.splash import splash_attention
    return splash_attention(q, k, v, spec, q_meta, k_meta, interpret=interpret)
  if chosen in ("pallas_gpu", "pallas_mgpu"):
    return _pallas_gpu().pallas_gpu_attention(
        q, k, v, spec, q_meta, k_meta, interpret=True if interpret else None,
        forward="mosaic" if chosen == "pallas_mgpu" else "triton")
  return cudnn_attention(q, k, v, spec, q_meta, k_meta)


# The cached forward's path per implementation: the kernel that reads the cache's layout
# ([b, kv_heads, slots, d], a few queries over many slots) on each platform, or xla.
CACHED_KERNEL = {"pallas_gpu": "pallas_decode", "pallas_mgpu": "pallas_decode",
                 "cudnn": "pallas_decode"}


def _pallas_decode():
  return _kernel("pallas_decode")


# Head dims tpu_decode is picked for: with 64 (two heads per lane tile) a call relays the
# cache out into the kernel's tiles, a copy of k and v that xla's path does not make.
TPU_DECODE_HEAD_DIMS = (128, 256)


def _tpu_decode_reason(spec, q_len: int, slots: int, head_dim: int) -> str | None:
  """None where tpu_decode is picked for a TPU cached forward; else why xla runs it."""
  if head_dim not in TPU_DECODE_HEAD_DIMS:
    return (f"head_dim {head_dim}: tpu_decode is picked for {TPU_DECODE_HEAD_DIMS} only, "
            "since narrower heads make each call relay the cache out")
  return _kernel("tpu_decode").unsupported_reason(spec, q_len, slots, head_dim)


def cached_choose(impl: str, spec: MaskSpec, q_shape, slots: int, dtype=jnp.float32, *,
                  platform: str | None = None, interpret: bool | None = None) -> str:
  """The path of a KV-cache forward (decoding's prefill and steps: q [b, tq, h, d] over
  `slots` cache slots) for `model.attention_impl`:

    xla                    xla's cache_attention
    pallas_gpu, pallas_mgpu,
    cudnn                  pallas_decode (the flash-decoding kernel over the cache's layout;
                           cuDNN and the Hopper kernel have none for it), an error where it
                           cannot serve the call
    auto                   pallas_decode on GPU, tpu_decode on TPU, where it serves the
                           call; else xla
    splash                 tpu_decode (the TPU flash-decoding kernel; also in interpret
                           mode) where it serves the call, else xla (logged, with why)

  Logged once per distinct choice, as `choose` does."""
  if impl not in IMPLEMENTATIONS:
    raise AttentionImplError(f"unknown attention implementation {impl!r}; expected one of "
                             f"{IMPLEMENTATIONS}")
  platform = platform or current_platform()
  interpret = interpret_requested(interpret)
  q_len, head_dim = q_shape[1], q_shape[-1]
  chosen, note = "xla", ""
  if impl in CACHED_KERNEL:
    reason = None
    if platform != "gpu" and not interpret:
      reason = (f"its cached forwards run pallas_decode, a GPU kernel; this is "
                f"{platform.upper()} (or interpret mode, slow: {INTERPRET_ENV}=1)")
    reason = reason or _pallas_decode().unsupported_reason(spec, q_len, slots, head_dim)
    if reason:
      raise AttentionImplError(f"attention_impl={impl} cannot serve the cached {spec.kind} "
                               f"forward of {q_len} queries over {slots} slots, head_dim "
                               f"{head_dim}: {reason}; {FIX}")
    chosen = CACHED_KERNEL[impl]
  elif impl == "auto" and platform == "gpu":
    if _pallas_decode().unsupported_reason(spec, q_len, slots, head_dim) is None:
      chosen = "pallas_decode"
  elif (impl == "auto" and platform == "tpu") or (impl == "splash" and
                                                  (platform == "tpu" or interpret)):
    reason = _tpu_decode_reason(spec, q_len, slots, head_dim)
    if reason is None:
      chosen = "tpu_decode"
    elif impl == "splash":
      note = f" ({reason})"
  elif impl == "splash":
    note = f" (tpu_decode runs on TPU, or in interpret mode: {INTERPRET_ENV}=1)"
  key = ("cached", impl, chosen, spec.kind, platform, interpret and chosen != "xla")
  if key not in _logged:
    _logged.add(key)
    mode = " (interpret mode)" if key[-1] else ""
    log.info("attention: cached decoding forwards run %s for %s masks on %s%s "
             "(attention_impl=%s)%s", chosen, spec.kind, platform, mode, impl, note)
  return chosen


def cached_run(chosen: str, q, k, v, spec: MaskSpec, q_meta, k_meta, *,
               interpret: bool | None = None):
  """Call the path `cached_choose` returned (k, v in the cache's layout)."""
  if chosen in ("pallas_decode", "tpu_decode"):  # module cardjax/attention/{chosen}.py
    attention = getattr(_kernel(chosen), f"{chosen}_attention")
    return attention(q, k, v, spec, q_meta, k_meta,
                     interpret=True if interpret_requested(interpret) else None)
  from cardjax.attention.reference import cache_attention
  return cache_attention(q, k, v, spec, q_meta, k_meta)
