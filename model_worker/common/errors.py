"""Errors caused by what a user asked for: shown as one clear line (CLI exit 2, HTTP 4xx)."""


class UserInputError(ValueError):
    """Base class: the request cannot be served as given; the message says why."""


class PromptError(UserInputError):
    """Empty prompt, or longer than the model's context or the configured maximum."""


class LabelError(UserInputError):
    """Labels that do not occur in the prompt, or a target that cannot be used."""


class ModelLoadError(UserInputError):
    """Unknown model id or path, unreadable or corrupt weights."""


class UnsupportedModelError(ModelLoadError):
    """A model_type without a spec in the family registry
    (`model_worker/model/adapters/families/`)."""


class JobCancelled(UserInputError):
    """The job was cancelled (its message says by whom): raised where it stops, between two
    slices of its work (model_worker.experiments.slices)."""


def cancelled_message(who: str) -> str:
    """What a cancelled job's page says: cancelled, and by whom."""
    return f"cancelled by {who}"


def cancelling_text(who: str) -> str:
    """What a running job's status says between a cancel and its stop."""
    return f"cancelling (asked by {who}): it stops at its next slice or stage"
