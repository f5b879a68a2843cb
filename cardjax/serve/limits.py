"""What a shared server checks before it does any work for a request: the API key, the
body's size (before it is read whole, parsed or tokenized) and the queue's length.

Each refusal is one OpenAI-shaped error (protocol.APIError): 401 for a missing or wrong
key, 413 for a body over the limit, 429 with Retry-After when the queue is full. The
queue bound keeps memory bounded under any load: a refused client retries later instead
of parking its request (and its socket) here.
"""

from __future__ import annotations

import dataclasses
import hmac

from cardjax.errors import CardjaxError
from cardjax.serve.protocol import APIError

MAX_BODY_BYTES = 4 * 2**20  # a 32k-token prompt as JSON token ids is ~200 KB
MAX_QUEUE = 256
RETRY_AFTER_S = 1


@dataclasses.dataclass(frozen=True)
class Limits:
  max_body_bytes: int = MAX_BODY_BYTES
  max_queue: int = MAX_QUEUE  # requests waiting for a row; past it: 429
  api_key: str = ""  # "": no key needed (loopback only: see cli.py)

  def __post_init__(self):
    if self.max_body_bytes < 1:
      raise CardjaxError(f"--max-body-bytes={self.max_body_bytes} must be >= 1")
    if self.max_queue < 0:
      raise CardjaxError(f"--max-queue={self.max_queue} must be >= 0 (0: no request waits; "
                         "a request that finds every row busy gets 429)")

  def check_key(self, authorization: str | None) -> None:
    """401 unless the Authorization header is `Bearer <api_key>` (when a key is set)."""
    if not self.api_key:
      return
    scheme, _, token = (authorization or "").partition(" ")
    # compare_digest: the time taken does not tell how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                            self.api_key.encode()):
      raise APIError(401, "a valid API key is required: send the header 'Authorization: "
                          "Bearer <key>' with the key the server was started with "
                          "(--api-key)", kind="invalid_request_error",
                     code="invalid_api_key")

  def too_large(self) -> APIError:
    return APIError(413, f"the request body is over {self.max_body_bytes} bytes, this "
                         "server's limit (--max-body-bytes): send a shorter prompt",
                    code="request_too_large")

  async def read_body(self, scope, receive) -> bytes | None:
    """The body of an ASGI request, refused with 413 as soon as it is known to pass the
    limit: from its Content-Length before reading, or while it streams in. None: the
    client left before it was all sent."""
    for name, value in scope["headers"]:
      if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
        raise self.too_large()
    parts, size = [], 0
    while True:
      message = await receive()
      if message["type"] == "http.disconnect":
        return None
      part = message.get("body", b"")
      size += len(part)
      if size > self.max_body_bytes:
        raise self.too_large()
      parts.append(part)
      if not message.get("more_body", False):
        return b"".join(parts)

  def check_queue(self, waiting: int, adding: int) -> None:
    """429 when `adding` more requests would queue past max_queue."""
    if waiting + adding > self.max_queue:
      raise APIError(429, f"the server is busy: {waiting} requests are waiting, the most "
                          f"it queues is {self.max_queue} (--max-queue); retry after "
                          f"{RETRY_AFTER_S} s", kind="rate_limit_error",
                     code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
