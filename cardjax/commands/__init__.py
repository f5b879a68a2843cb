"""The commands whose work lives in a low package (model, data, hf): their modules sit here,
beside the command table (cardjax/cli.py), so that those packages import nothing above them
(a command reads configs and checkpoints; the model, the data and the HF converters do not)."""
