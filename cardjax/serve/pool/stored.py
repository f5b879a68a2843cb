"""A pool's compiled programs kept whole on disk, so that a restart loads them untraced.

jax's persistent compilation cache spares a restart XLA's compile, not the tracing and
lowering that compute the cache's key. A server's warm-up runs a few hundred small programs
(each batch size, prompt width and cache span), and on a cached start those two were most
of its time (on 2 CPU cores, about 63 of 77 profiled seconds). A `ProgramStore` keys a
program by what determines it without tracing it:
  - the program's name and static arguments, and a `context` string for what a jitted
    function closes over and takes first (a model's graph definition, which holds its
    config, and its weights' shapes);
  - the shapes, dtypes and tree structure of its arguments;
  - a fingerprint of the code and platform (`fingerprint`): cardjax's source, the jax,
    jaxlib, flax and numpy versions, the backend and its devices, XLA_FLAGS and the
    CARDJAX_ variables, and the jax options that change a program;
and keeps the serialized executable (jax.experimental.serialize_executable) under the hash
of that key, in a `programs` folder inside the compilation cache. What is not there is
compiled (afresh, not from jax's cache: `_compile_storable`) and stored; a file that fails
to load (a torn write, another jaxlib) is compiled again and replaced, with a warning. The
pools' programs then never come from jax's cache: a change to cardjax's source compiles
them all once again.

The folder is as trusted as the compilation cache itself: loading an executable may run
code, so it must be the user's own folder (the default is under ~/.cache).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import threading
from pathlib import Path

import jax

log = logging.getLogger(__name__)

FOLDER = "programs"  # inside the compilation cache folder
_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_threefry_partitionable",
            "jax_default_prng_impl", "jax_numpy_dtype_promotion")
_folder: str = ""  # set by use(): the compilation cache folder of this process


def use(cache_folder: str) -> None:
  """Keep the pools' programs in `cache_folder`/programs from now on ('' stops)."""
  global _folder
  _folder = cache_folder


def default() -> "ProgramStore | None":
  """The store of the folder `use` set, None when none is set."""
  return _store(_folder) if _folder else None


_stores: dict[str, "ProgramStore"] = {}


def _store(cache_folder: str) -> "ProgramStore":
  if cache_folder not in _stores:
    _stores[cache_folder] = ProgramStore(Path(cache_folder) / FOLDER)
  return _stores[cache_folder]


def _source_hash() -> str:
  """sha256 of cardjax's Python source, path by path."""
  import cardjax

  root = Path(cardjax.__file__).parent
  digest = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()


def fingerprint() -> str:
  """What every stored program depends on besides its own key (the module docstring)."""
  import flax
  import jaxlib
  import numpy as np

  device = jax.devices()[0]
  parts = [_source_hash(), jax.__version__, jaxlib.__version__, flax.__version__,
           np.__version__, device.platform, device.client.platform_version,
           device.device_kind, str(jax.device_count()), os.environ.get("XLA_FLAGS", ""),
           os.environ.get("LIBTPU_INIT_ARGS", "")]
  parts += sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("CARDJAX_"))
  parts += [f"{name}={getattr(jax.config, name, None)}" for name in _OPTIONS]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def signature(args) -> tuple:
  """The tree structure and per-leaf (shape, dtype, weak type) of `args`: what a compiled
  program accepts (hashable; its repr names the same things across processes)."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  return (tree,) + tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x))),
                          bool(getattr(x, "weak_type", False))) for x in leaves)


def model_context(graphdef, state) -> str:
  """The `context` of a model's programs: its graph definition (structure and config) and
  its weights' shapes and dtypes, hashed once per pool rather than flattened per call."""
  return hashlib.sha256(repr((graphdef, signature(state))).encode()).hexdigest()


# An XLA option that only changes what a dump of the program holds, so its compile gets
# a key of its own in jax's persistent cache (jax leaves the other dump options out of it).
_OWN_KEY = {"xla_dump_large_constants": True}


def _compile_storable(lowered):
  """`lowered` compiled afresh, never loaded from jax's persistent cache, nor written to it;
  None where this jax has no per-thread switch for the cache's writes.

  An executable jax's cache loaded serializes incompletely on a CPU (jaxlib 0.10: its copy
  fails with "Function ... not found" when run), so what is stored must not come from it:
  the compile takes a key of its own (`_OWN_KEY`), which jax's cache never holds because
  its writes are off for this compile (per thread, unlike jax.config.update: prefills also
  compile on a background thread)."""
  try:
    from jax._src import config
    no_writes = config.persistent_cache_min_compile_time_secs(float("inf"))
  except (ImportError, AttributeError, TypeError):
    return None
  try:
    with no_writes:
      return lowered.compile(compiler_options=_OWN_KEY)
  except Exception as e:  # an XLA without the option: the plain compile says what else
    log.warning("a storable compile failed (%s: %s); this program is not stored",
                type(e).__name__, e)
    return None


class ProgramStore:
  """Compiled programs by key: in memory, then on disk in `folder`, else compiled.

  Counts what it did: `loaded` (from disk) and `compiled` (not there, or unreadable)."""

  def __init__(self, folder: Path):
    self.folder = Path(folder)
    self.loaded = self.compiled = 0
    self._memory: dict = {}
    self._fingerprint: str | None = None
    self._lock = threading.Lock()  # the counters: prefills also compile on a background thread

  def program(self, name: str, jitted, args: tuple, static: dict | None = None,
              context: str = "", skip: int = 0):
    """The compiled `jitted(*args, **static)`, called as program(*args).

    context: names what the skipped arguments and the function's closure hold; skip:
    leading arguments that are the same for every call under this context (a model's
    weights), left out of the in-memory key so that a call does not flatten them (they
    are in the disk key)."""
    static = static or {}
    key = (id(jitted), name, tuple(sorted(static.items())), context, signature(args[skip:]))
    found = self._memory.get(key)
    if found is None:
      found = self._memory[key] = self._load_or_compile(name, jitted, args, static, context)
    return found

  def _path(self, name: str, args, static: dict, context: str) -> Path:
    if self._fingerprint is None:
      self._fingerprint = fingerprint()
    text = repr((self._fingerprint, name, sorted(static.items()), context, signature(args)))
    return self.folder / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:32]}.bin"

  def _load_or_compile(self, name: str, jitted, args, static: dict, context: str):
    from jax.experimental import serialize_executable

    path = self._path(name, args, static, context)
    if path.exists():
      try:
        payload, in_tree, out_tree, ids = pickle.loads(path.read_bytes())
        devices = {d.id: d for d in jax.devices()}
        program = serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=[devices[i] for i in ids])
        with self._lock:
          self.loaded += 1
        return program
      except Exception as e:  # a torn or foreign file: compile it again
        log.warning("stored program %s did not load (%s: %s); compiling it again", path,
                    type(e).__name__, e)
    lowered = jitted.lower(*args, **static)
    program = _compile_storable(lowered)
    with self._lock:
      self.compiled += 1
    if program is None:  # nothing storable: jax's own caches only
      return lowered.compile()
    try:
      # The devices it runs on (a pool's: one), which loading must name: by default it
      # would expect an argument shard on every device of the process.
      ids = sorted({d.id for sharding in jax.tree.leaves(program.input_shardings)
                    for d in sharding.device_set})
      blob = pickle.dumps((*serialize_executable.serialize(program), ids))
      self.folder.mkdir(parents=True, exist_ok=True)
      partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
      try:
        partial.write_bytes(blob)
        os.replace(partial, path)  # whole or absent: a crash never leaves half a program
      finally:
        partial.unlink(missing_ok=True)  # what a full disk left of it
    except (OSError, ValueError, NotImplementedError) as e:  # a full disk, an unstorable one
      log.warning("could not store program %s (%s: %s); it compiles again on a restart",
                  path.name, type(e).__name__, e)
    return program
