"""Text generation from kenotron models: sampling, a batched generator with a cache (attention
keys and values, Mamba layers' recurrent state), and the models to run it on (a flavor, a
kenotron checkpoint, a Hugging Face folder). Imports `models` and `checkpoint`; neither imports
this."""

from kenotron.generate.generator import cache_description, generate, left_pad
from kenotron.generate.loading import (
    build_kenotron_model,
    load_checkpoint_model,
    load_hf_model,
)
from kenotron.generate.sampling import SamplingConfig, sample_next_token

__all__ = [
    "SamplingConfig",
    "build_kenotron_model",
    "cache_description",
    "generate",
    "left_pad",
    "load_checkpoint_model",
    "load_hf_model",
    "sample_next_token",
]
