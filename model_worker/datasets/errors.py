"""Errors raised while loading or using a dataset."""


class DatasetError(ValueError):
    """A dataset file or dataset request that cannot be used; the message says why."""
