"""The data layer: tfds builders, tokenizers, and grain pipelines to global arrays."""

from cardjax.data.pipeline import DataLoader, PipelineSpec, make_dataset, to_global
from cardjax.data.prepare import load_data_tokenizer, make_loader, pipeline_spec, prepare
from cardjax.data.tokenizer import Tokenizer, load_tokenizer, train_bpe

__all__ = ["DataLoader", "PipelineSpec", "make_dataset", "to_global", "make_loader",
           "pipeline_spec", "prepare", "load_data_tokenizer", "Tokenizer", "load_tokenizer",
           "train_bpe"]
