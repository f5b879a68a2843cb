"""The project's error types. Each message names the thing that is wrong and the fix.

The CLI prints these without a traceback; anything else is a bug and keeps its traceback.
"""


class CardjaxError(ValueError):
  """Bad input that the user can fix (a file, a key, a shape, a value)."""


class ConfigError(CardjaxError):
  """An unknown, mistyped or inconsistent configuration value."""


class CheckpointError(CardjaxError):
  """A missing, incomplete or mismatched checkpoint (orbax or Hugging Face)."""
