"""Local cloud-storage emulators on loopback, started and stopped by the tests.

GCS: `gcp-storage-emulator` (PyPI; started through gcs_emulator_main.py, which adds the
x-goog-generation header tensorstore needs), reached by gcsfs through STORAGE_EMULATOR_HOST and by
tensorstore (orbax's array writer) through TENSORSTORE_GCS_HTTP_URL. S3: moto's server,
reached by s3fs/boto3 and tensorstore through AWS_ENDPOINT_URL with dummy keys.

    with gcs_emulator() as env:      # env: the variables a subprocess needs
      subprocess.run([...], env={**os.environ, **env})

Each emulator runs in its own process with its data in memory; the bucket "cardjax-test"
exists from the start.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time

BUCKET = "cardjax-test"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, log: str, timeout: float = 60) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"emulator exited with {proc.returncode}:\n{open(log).read()}")
    with socket.socket() as s:
      if s.connect_ex(("127.0.0.1", port)) == 0:
        return
    time.sleep(0.1)
  raise RuntimeError(f"emulator did not listen on port {port} in {timeout} s")


@contextlib.contextmanager
def _serve(args: list[str], port: int):
  log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
  proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT)
  try:
    _wait_listening(port, proc, log.name)
    yield
  finally:
    proc.terminate()
    try:
      proc.wait(10)
    except subprocess.TimeoutExpired:
      proc.kill()
    log.close()
    os.unlink(log.name)


@contextlib.contextmanager
def gcs_emulator():
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  # Through gcs_emulator_main.py: downloads then carry x-goog-generation, which tensorstore
  # (orbax) needs for its second write of an object.
  launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gcs_emulator_main.py")
  with _serve([launcher, "start", "--host", "127.0.0.1", "--port", str(port),
               "--in-memory", "--default-bucket", BUCKET], port):
    yield {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url}


@contextlib.contextmanager
def s3_emulator():
  port = _free_port()
  env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
         "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
  with _serve(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port):
    import boto3
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                 aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
    yield env


@contextlib.contextmanager
def emulated(scheme: str):
  """(env, root URI) of a fresh emulator of `scheme` ("gs" or "s3"), with `env` applied to
  this process too (and fsspec's cached file systems dropped, so they see it)."""
  import fsspec

  start = gcs_emulator if scheme == "gs" else s3_emulator
  with start() as env:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    fsspec.AbstractFileSystem.clear_instance_cache()
    _drop_cached_file_systems()
    try:
      yield env, f"{scheme}://{BUCKET}"
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
      _drop_cached_file_systems()


def _drop_cached_file_systems() -> None:
  """gcsfs / s3fs instances read their endpoint when made; fsspec and etils.epath keep
  them, so a second emulator (another port) in one test process would reach the first."""
  from etils.epath import backend

  for cls in _fs_classes():
    cls.clear_instance_cache()
  backend._FileSystemSpecBackend._get_filesystem.cache_clear()


def _fs_classes():
  import gcsfs
  import s3fs
  return [gcsfs.GCSFileSystem, s3fs.S3FileSystem]
