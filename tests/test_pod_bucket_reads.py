"""A two-host job trains from a dataset kept in a bucket (GCS and S3 emulators), each host
fetching only the shard files of its data shards: at most half the split's bytes plus one
shard file, against the build's size; every record read is this host's. Real processes
over gloo, each with its own machine cache folder as on a pod."""

import os
import re

import pytest
import tensorflow_datasets as tfds
from cloud_emulators import emulated
from launch_helpers import SMALL, checkout_env
from pod_helpers import Hosts, train_args

from cardjax.config import load_config
from cardjax.data import builders
from cardjax.data.prepare import data_dir as config_data_dir, prepare
from cardjax.storage import trees

pytestmark = pytest.mark.integration  # a build, an upload and a two-host job per bucket

NUM_SHARDS = 8
OPTIONS = ["--config.data.options.max_files=300"]
FETCHED = re.compile(r"data cache: fetched (\S+) \(")


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_each_host_fetches_only_its_share_of_a_bucket_build(scheme, tmp_path):
  local = tmp_path / "data"
  config = load_config("configs/tiny_ar.py", [f"--config.data.data_dir={local}", *SMALL,
                                              *OPTIONS])
  builder = builders.make_builder(config.data.dataset, config_data_dir(config),
                                  **dict(config.data.options))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(num_shards=NUM_SHARDS))
  prepare(config)  # the tokenizer, next to the build
  build = builder.data_dir
  sizes = {n: os.path.getsize(os.path.join(build, n)) for n in os.listdir(build)}
  train_files = {n: b for n, b in sizes.items() if "-train.array_record-" in n}
  assert len(train_files) == NUM_SHARDS
  with emulated(scheme) as (env, root):
    trees.upload(str(local), f"{root}/data")
    hosts = Hosts(2, train_args(tmp_path / "run", f"{root}/data", 6, *OPTIONS),
                  tmp_path / "logs", env=checkout_env({**os.environ, **env}),
                  host_env={i: {"CARDJAX_CACHE": str(tmp_path / f"cache_{i}")}
                            for i in range(2)})
    assert hosts.wait(timeout=400) == [0, 0], hosts.tail()
  half = sum(train_files.values()) / 2 + max(train_files.values())
  fetched_by_host = []
  for i in range(2):
    names = [os.path.basename(uri) for uri in FETCHED.findall(hosts.output(i))]
    assert len(names) == len(set(names)), names  # no file fetched twice
    train = [n for n in names if n in train_files]
    assert train and sum(train_files[n] for n in train) <= half, (train, half)
    fetched_by_host.append(set(train))
    assert f"this host reads {len(train)} of the {NUM_SHARDS} shard files" in hosts.output(i)
    total = sum(sizes[n] for n in names)
    assert total < sum(sizes.values()) * 0.7  # far from the whole build
  assert len(fetched_by_host[0] & fetched_by_host[1]) <= 1  # at most the boundary file
