"""The model itself: loading a checkpoint, its family's adapter, hooks that capture, record q/k or
intervene, prompt tokenization and token text. Imports common/, resources/ and analysis/ only."""
