"""Generated tokens -> the text a client sees, a chunk at a time, cut at stop strings.

Each update decodes the whole generation so far (byte-level BPE pieces only make valid
UTF-8 together) and hands out what is new. Until the request ends it holds back an
unfinished character (U+FFFD) and the last len(longest stop) - 1 characters, which might be
the start of a stop string: a streamed delta is never taken back.
"""

from __future__ import annotations

from typing import Sequence


class TextStream:
  def __init__(self, tokenizer, stops: Sequence[str] = ()):
    self.tokenizer = tokenizer
    self.stops = [s for s in stops if s]
    self.hold = max((len(s) for s in self.stops), default=1) - 1
    self.sent = 0  # characters handed out
    self.text = ""  # the final text, once ended

  def update(self, tokens: Sequence[int], final: bool) -> tuple[str, bool]:
    """(new text, hit a stop string). After a hit or `final` the stream has ended and
    `text` holds everything, without the stop string."""
    full = self.tokenizer.decode(tokens, skip_special=True)
    cut = min((i for i in (full.find(s, max(0, self.sent - self.hold)) for s in self.stops)
               if i >= 0), default=-1)
    stopped = cut >= 0
    if stopped:
      full = full[:cut]
    end = len(full)
    if not (final or stopped):
      end = max(self.sent, end - self.hold)
      while end > self.sent and full[end - 1] == "\ufffd":
        end -= 1
    delta = full[self.sent:end]
    self.sent = end
    if final or stopped:
      self.text = full
    return delta, stopped
