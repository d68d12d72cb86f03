"""The one error type of the RFT path: bad input or settings, printed by the CLI as one line."""


class RFTError(ValueError):
    """Bad RFT input or settings (not a bug): the `torchref` CLI prints it as one line, exit code 2."""
