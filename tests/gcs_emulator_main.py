"""`gcp-storage-emulator` with the one header tensorstore needs: object downloads carry
`x-goog-generation`, as real GCS sends. tensorstore's gcs driver (orbax's array writer)
reads it to make its conditional writes; without it the second write of an OCDBT manifest
fails with "Malformed StorageGeneration". Usage: python gcs_emulator_main.py start ..."""

import sys

from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except Exception:  # a missing object: the handler answers 404 itself
    obj = None
  if obj is not None and obj.get("generation"):
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj.get("metageneration") or 1)
  return _download(request, response, storage, *args, **kwargs)


objects.download = _download_with_generation

from gcp_storage_emulator.__main__ import main  # noqa: E402 (after the patch: routes bind it)

if __name__ == "__main__":
  sys.exit(main())
