"""Looking inside models: TransformerLens's hook points (tinyllm/nn/hooks.py, on every model through
tinyllm/models/hooks.py), the logit and tuned lens, sparse autoencoders and memorization probes. docs/interp.md
describes each instrument and what it was checked against."""
from .lens import TunedLens, format_report, lens_report, logit_lens  # noqa: F401
from .memorized import (ExposureResult, MemorizationResult, exposure, extraction, log_perplexities,  # noqa: F401
                           memorization)
from .sae import SparseAutoencoder, collect_activations, sae_metrics, train_sae  # noqa: F401
