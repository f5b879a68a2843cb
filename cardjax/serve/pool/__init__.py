"""The serving runtime's continuous batching: rows that keep their KV cache between decode
calls (slots.py: `SlotPool`), the jitted programs a pool calls (programs.py) and the KV of
prompt prefixes many requests share (prefixes.py: `PrefixStore`). Only `cardjax serve`
uses it; cardjax/decoding/ holds the one-shot decoders over token arrays it builds on."""
