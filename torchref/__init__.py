"""torchref: the PyTorch reference (HF transformers is the reference forward) and the RFT path."""

__version__ = "0.1.0"
