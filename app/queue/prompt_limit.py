"""Refuse a too-long prompt at submission (422 with both numbers) without loading a model.

Each worker publishes its tokenizer (the `tokenizers` JSON) and its token limit; the web tier
counts tokens with the same tokenizer. Without a published tokenizer the worker still refuses
the prompt, as a failed job with the same message.
"""

from __future__ import annotations

from redis import Redis
from tokenizers import Tokenizer

from app.queue.interface import BackendError
from model_worker.checks.patch_pairs import Encode
from model_worker.service.queue.heartbeats import WorkerBeat
from model_worker.service.queue.keys import tokenizer_key


class PromptLimit:
    """Token counting for the models that live workers serve, one tokenizer per fingerprint."""

    def __init__(self) -> None:
        self._tokenizers: dict[str, Tokenizer] = {}

    def _tokenizer(self, connection: Redis, fingerprint: str) -> Tokenizer | None:
        if fingerprint not in self._tokenizers:
            raw = connection.get(tokenizer_key(fingerprint))
            if raw is None:
                return None
            self._tokenizers[fingerprint] = Tokenizer.from_str(
                raw.decode() if isinstance(raw, bytes) else str(raw)
            )
        return self._tokenizers[fingerprint]

    def check(self, connection: Redis, beats: list[WorkerBeat], prompt: str) -> int | None:
        """The prompt's number of tokens (None when no tokenizer is published);
        BackendError(422) when it has more tokens than the workers accept."""
        tokenizer = self._tokenizer(connection, min(beat.fingerprint for beat in beats))
        if tokenizer is None:
            return None
        n_tokens = len(tokenizer.encode(prompt).ids)
        limits = [beat.max_prompt_tokens for beat in beats if beat.max_prompt_tokens]
        if limits and n_tokens > min(limits):
            raise BackendError(f"the prompt has {n_tokens} tokens; the limit is {min(limits)}", 422)
        return n_tokens

    def encoder(self, connection: Redis, beats: list[WorkerBeat]) -> Encode | None:
        """The workers' tokenizer as `model_worker.checks.patch_pairs` uses it (ids and character
        offsets), refusing a text over the limit (422); None when no tokenizer is published."""
        tokenizer = self._tokenizer(connection, min(beat.fingerprint for beat in beats))
        if tokenizer is None:
            return None
        limits = [beat.max_prompt_tokens for beat in beats if beat.max_prompt_tokens]

        def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
            found = tokenizer.encode(text)
            if limits and len(found.ids) > min(limits):
                raise BackendError(
                    f"the prompt has {len(found.ids)} tokens; the limit is {min(limits)}", 422
                )
            return list(found.ids), [(int(a), int(b)) for a, b in found.offsets]

        return encode
