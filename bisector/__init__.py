"""bisector: find the vLLM commit behind a ROCm GPU fault, and prove its fix backports."""

__version__ = "0.1.0"
