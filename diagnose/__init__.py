"""diagnose: OOM and failure diagnosis for Megatron-Bridge / Megatron-Core training jobs."""

__version__ = "0.1.0"
