"""Generated tokens -> the text a client sees, a chunk at a time, cut at stop strings.

Incremental: each update decodes only the tokens that arrived since the text last became
whole, so a step's delivery costs what its new tokens cost, not the whole generation so far
(a long completion made every step slower). The new tokens are decoded together with the
ones before them since the last whole point (`prefix`), and the text of that prefix alone
is subtracted: a byte-level BPE piece is only valid UTF-8 together with its neighbours, and
a SentencePiece-style decoder strips the leading space of the first token of a window, so
both windows start at the same token and the difference is exactly the new text. The
window moves on only once its text ends in a whole character (no U+FFFD), so a character
split across tokens (or steps) comes out once, whole.

Stop strings are searched in the new text and the last len(longest stop) - 1 characters
before it, never in the whole text again. Until the request ends the stream holds back an
unfinished character and those last characters, which might be the start of a stop string:
a streamed delta is never taken back.
"""

from __future__ import annotations

from typing import Sequence

REPLACEMENT = "\ufffd"


class TextStream:
  def __init__(self, tokenizer, stops: Sequence[str] = ()):
    self.tokenizer = tokenizer
    self.stops = [s for s in stops if s]
    self.hold = max((len(s) for s in self.stops), default=1) - 1
    self.sent = 0  # characters handed out
    self.text = ""  # the final text, once ended
    self._whole = ""  # text of tokens[:self._read], ending in a whole character
    self._prefix = 0  # the decode window starts here (the last whole point but one)
    self._read = 0  # tokens whose text is in self._whole

  def _decode(self, tokens: Sequence[int]) -> str:
    return self.tokenizer.decode(tokens, skip_special=True)

  def _advance(self, tokens: Sequence[int], final: bool) -> str:
    """The text of every token so far: self._whole plus the new tokens' text; the window
    moves on when that text ends whole (always when `final`: a cut character stays U+FFFD,
    as a whole decode gives it)."""
    if len(tokens) <= self._read:
      return self._whole
    before = self._decode(tokens[self._prefix:self._read])
    window = self._decode(tokens[self._prefix:])
    if not window.startswith(before):
      # A decoder that rewrote the earlier text (it never does for byte-level BPE or
      # SentencePiece): fall back to the whole generation, which is always right.
      full = self._decode(tokens)
      if final or not full.endswith(REPLACEMENT):
        self._whole, self._prefix, self._read = full, self._read, len(tokens)
      return full
    text = self._whole + window[len(before):]
    if final or not window.endswith(REPLACEMENT):
      self._whole, self._prefix, self._read = text, self._read, len(tokens)
    return text

  def update(self, tokens: Sequence[int], final: bool) -> tuple[str, bool]:
    """(new text, hit a stop string). `tokens` is the whole generation so far (the same
    list, grown). After a hit or `final` the stream has ended and `text` holds everything,
    without the stop string."""
    full = self._advance(tokens, final)
    start = max(0, self.sent - self.hold)
    cut = min((i for i in (full.find(s, start) for s in self.stops) if i >= 0), default=-1)
    stopped = cut >= 0
    if stopped:
      full = full[:cut]
    end = len(full)
    if not (final or stopped):
      end = max(self.sent, end - self.hold)
      while end > self.sent and full[end - 1] == REPLACEMENT:
        end -= 1
    delta = full[self.sent:end]
    self.sent = end
    if final or stopped:
      self.text = full
    return delta, stopped
