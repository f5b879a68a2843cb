"""tfds builders of the data layer, built to array_record and read as random-access sources.

    build("text_corpus", "/data/tfds", paths="docs/**/*.md,notes.txt")
    src = load_source("text_corpus", "train", "/data/tfds", paths="docs/**/*.md,notes.txt")
    grain.MapDataset.source(src).map(decode)

Options are the fields of each builder's config (`BUILDERS[name].CONFIG_CLS`); a build lives
in DATA_DIR/NAME/CONFIG/VERSION, CONFIG being a readable prefix plus a hash of the options.
load_source never builds: an unbuilt dataset is an error that says how to build it.
DATA_DIR may be a bucket (gs://, s3://): builds are written locally, then uploaded; a read
fetches the shard files it needs into a bounded cache (cardjax/data/bucket_builds.py).
`build(..., beam_runner=...)` runs the builder on Apache Beam (all but arith_sft), writing
the same shards.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping

import tensorflow_datasets as tfds

from cardjax.data import bucket_builds
from cardjax.data.builders.arith_sft import ArithSft
from cardjax.data.builders.common import OptionsConfig, coerce_option
from cardjax.data.builders.python_stdlib import PythonStdlib
from cardjax.data.builders.sft_jsonl import SftJsonl
from cardjax.data.builders.text_corpus import TextCorpus
from cardjax.errors import CardjaxError, ConfigError
from cardjax.storage import is_remote, resolve

BUILDERS: dict[str, type[tfds.core.GeneratorBasedBuilder]] = {
    "text_corpus": TextCorpus,
    "python_stdlib": PythonStdlib,
    "sft_jsonl": SftJsonl,
    "arith_sft": ArithSft,
}


# Beam runners that run on this machine, so their workers see its local staging folder.
LOCAL_RUNNERS = ("DirectRunner", "PrismRunner")


def make_config(name: str, **options) -> OptionsConfig:
  """The named builder's config; option values may be CLI strings ("20000", "a.txt,b/*.py")."""
  if name not in BUILDERS:
    raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(BUILDERS)}")
  config_cls = BUILDERS[name].CONFIG_CLS
  known = config_cls.option_names()
  unknown = sorted(set(options) - set(known))
  if unknown:
    raise ConfigError(
        f"dataset {name} has no option {', '.join(unknown)}; its options are: {', '.join(known)}")
  return config_cls(**{k: coerce_option(config_cls, name, k, v) for k, v in options.items()})


def make_builder(name: str, data_dir: str | os.PathLike, **options) -> tfds.core.DatasetBuilder:
  """The builder of dataset `name` with these options under `data_dir` (nothing is built).

  For a bucket data_dir the builder works in the local copy (bucket_builds.local_dir)."""
  config = make_config(name, **options)
  local = bucket_builds.local_dir(_abs(data_dir))
  return BUILDERS[name](data_dir=local, file_format="array_record", config=config)


def location(builder: tfds.core.DatasetBuilder, data_dir: str | os.PathLike) -> str:
  """Where the build lives: its folder, or for a bucket data_dir the bucket folder."""
  root = _abs(data_dir)
  if not is_remote(root):
    return os.fspath(builder.data_dir)
  return bucket_builds.remote_folder(root, os.fspath(builder.data_dir))


def build(name: str, data_dir: str | os.PathLike, *, beam_runner: str | None = None,
          beam_options: str = "", **options) -> tfds.core.DatasetBuilder:
  """Build (download_and_prepare) the dataset unless already built; returns the builder.

  `beam_runner` (e.g. "DirectRunner", "DataflowRunner") runs the build on Apache Beam with
  `beam_options` (its command-line flags as one string)."""
  root = _abs(data_dir)
  if beam_runner and is_remote(root) and beam_runner not in LOCAL_RUNNERS:
    raise ConfigError(
        f"--beam-runner {beam_runner} with data_dir {root}: a distributed runner's workers "
        "write the shards, and ArrayRecord writes only local files, so they cannot write to "
        "a bucket or to this machine's staging folder; give --data-dir a folder that this "
        "machine and every worker mount at the same path (NFS, gcsfuse, mountpoint-s3), or "
        f"use {' / '.join(LOCAL_RUNNERS)}")
  builder = make_builder(name, root, **options)
  if is_remote(root):
    folder = location(builder, root)
    if bucket_builds.is_uploaded(folder):  # built elsewhere: read from a local copy
      bucket_builds.fetch(folder, os.fspath(builder.data_dir))
      return make_builder(name, root, **options)  # a fresh builder reads the copied info
  download_config = None
  if beam_runner:
    download_config = beam_download_config(builder, beam_runner, beam_options)
  builder.download_and_prepare(download_config=download_config)
  if is_remote(root):
    bucket_builds.upload(os.fspath(builder.data_dir), location(builder, root))
  return builder


def beam_download_config(builder, runner: str, options: str):
  """tfds' DownloadConfig that runs `builder` on Beam's `runner` with these flags."""
  if not getattr(builder, "SUPPORTS_BEAM", False):
    beamable = ", ".join(n for n, b in BUILDERS.items() if getattr(b, "SUPPORTS_BEAM", False))
    raise ConfigError(f"dataset {builder.name} has no Beam build (datasets with one: "
                      f"{beamable}); drop --beam-runner")
  try:
    from apache_beam.options.pipeline_options import PipelineOptions
  except ImportError:
    raise CardjaxError("--beam-runner needs Apache Beam: pip install 'cardjax[beam]' "
                       "(or apache-beam[gcp] for Dataflow)") from None
  builder.use_beam = True
  return tfds.download.DownloadConfig(beam_runner=runner,
                                      beam_options=PipelineOptions(shlex.split(options)))


def build_command(name: str, data_dir: str | os.PathLike, **options) -> str:
  """The `cardjax data build` command line that builds this dataset."""
  args = ["cardjax", "data", "build", name, "--data-dir", _abs(data_dir)]
  for key, value in options.items():  # flags with dashes: --train-size is train_size
    text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    args += [f"--{key.replace('_', '-')}", text]
  return " ".join(shlex.quote(a) for a in args)


def load_source(name: str, split: str, data_dir: str | os.PathLike, *,
                cache_gb: float | None = None, **options):
  """The built split as a random-access source (len, [i]) for grain.MapDataset.source.

  For a bucket data_dir only the build's metadata is downloaded; its shard files are
  fetched as records in them are read, into a cache of at most `cache_gb` GB (default
  $CARDJAX_DATA_CACHE_GB, else 50; cardjax/data/bucket_builds.py)."""
  root = _abs(data_dir)
  builder = make_builder(name, root, **options)
  sizes = None
  if is_remote(root):
    folder = location(builder, root)
    if bucket_builds.is_uploaded(folder):
      sizes = bucket_builds.fetch_metadata(folder, os.fspath(builder.data_dir))
      builder = make_builder(name, root, **options)
    else:
      builder = None
  if builder is None or not builder.is_prepared():  # also a data_dir that does not exist
    shown = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "defaults"
    raise CardjaxError(
        f"dataset {name} (options {shown}) is not built in {_abs(data_dir)}; run "
        f"`{build_command(name, data_dir, **options)}`")
  available = list(builder.info.splits.keys())
  if re.split(r"[\[+]", split)[0] not in available:  # allow tfds slices such as train[:10%]
    raise CardjaxError(
        f"dataset {name} has no split {split!r}; available splits: {', '.join(available)}")
  if sizes is not None:
    return bucket_builds.open_split(builder, split, folder, sizes, cache_gb)
  return builder.as_data_source(split=split)


def decode(example: Mapping) -> dict:
  """A stored example as Python values: bytes -> str, "messages" JSON -> list of dicts."""
  out = {}
  for key, value in example.items():
    if isinstance(value, bytes):
      value = value.decode("utf-8")
    out[key] = json.loads(value) if key == "messages" else value
  return out


def _abs(data_dir: str | os.PathLike) -> str:
  return resolve(data_dir)


__all__ = ["BUILDERS", "build", "build_command", "decode", "load_source", "location",
           "make_builder", "make_config"]
