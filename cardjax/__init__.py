"""cardjax: JAX training and decoding for language models that write more than one token
per forward pass (CARD, MARS, DUS) and the baselines they are compared against."""

__version__ = "0.1.0"
