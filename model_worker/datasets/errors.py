"""Errors raised while loading or using a dataset, and how they quote the user's values."""

#: Longest quotation of a user's value (a label, a row) in an error message.
MAX_SHOWN = 60


def shown(value: object) -> str:
    """`repr(value)`, cut to MAX_SHOWN characters: messages echo input, never megabytes of it."""
    if isinstance(value, int) and abs(value) >= 10**MAX_SHOWN:  # repr fails past 4,300 digits
        return f"a number of more than {MAX_SHOWN} digits"
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


class DatasetError(ValueError):
    """A dataset file or dataset request that cannot be used; the message says why."""
