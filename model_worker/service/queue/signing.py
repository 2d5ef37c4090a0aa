"""Results signed by the worker that computed them, checked by the web tier before it serves or
keeps them (HMAC-SHA256), so that nothing planted in Redis passes for a computed result.

A signature covers the job id, the SHA-256 of the request the web tier handed the worker
(`request_digest`), and every part of the result (name and bytes, length-prefixed). The secret
is `ICL_RESULT_KEYS`, shared by the web tier and the workers: comma-separated keys, the first
signs, each one is accepted (rotation: put the new key first everywhere, drop the old one once
no result signed with it waits in Redis). Without keys a fixed development key is used: results
are then not authenticated (`icl-heads serve` refuses a public bind in Redis mode without keys).
The embedded server needs none: its results never leave the process before the store.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from pydantic import BaseModel

from model_worker.common.settings import Settings
from model_worker.service.queue.result_parts import Parts

#: The field of a result's Redis hash that holds its signature (not a part of the result).
SIGNATURE_PART = "sig"
#: The part name a running analysis' per-head stage is signed under.
HEADS_STAGE_PART = "heads-stage"
VERSION = b"icl-heads-result-v1"
#: Shortest key accepted (characters).
MIN_KEY_CHARS = 16
#: The key used when none is configured: known to anyone, so it authenticates nothing.
DEVELOPMENT_KEY = b"icl-heads development key: set ICL_RESULT_KEYS"


class SigningKeyError(ValueError):
    """`ICL_RESULT_KEYS` holds a key too short to be a secret."""


def request_digest(request: BaseModel) -> str:
    """SHA-256 of the request's canonical JSON (the same on both sides of the queue)."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def _message(job_id: str, digest: str, parts: Parts) -> bytes:
    chunks = [VERSION, job_id.encode(), digest.encode()]
    for name in sorted(parts):
        chunks += [name.encode(), parts[name]]
    return b"".join(len(chunk).to_bytes(8, "big") + chunk for chunk in chunks)


class ResultSigner:
    """Signs with the first key, accepts any of them."""

    def __init__(self, keys: Sequence[bytes], configured: bool = True) -> None:
        if not keys:
            raise SigningKeyError("no result signing key")
        self._keys = list(keys)
        #: False when running on the development key (nothing is authenticated).
        self.configured = configured

    def _mac(self, key: bytes, job_id: str, digest: str, parts: Parts) -> str:
        return hmac.new(key, _message(job_id, digest, parts), hashlib.sha256).hexdigest()

    def sign(self, job_id: str, digest: str, parts: Parts) -> bytes:
        """The signature of `parts` as the result of `job_id` for the request `digest`."""
        return self._mac(self._keys[0], job_id, digest, parts).encode()

    def signed(self, job_id: str, digest: str, parts: Parts) -> Parts:
        """`parts` with their signature added (what a worker writes to Redis)."""
        return {**parts, SIGNATURE_PART: self.sign(job_id, digest, parts)}

    def verify(self, job_id: str, digest: str, signed: Parts) -> Parts | None:
        """The parts of `signed` without the signature when one of the keys made it; else None
        (unsigned, another job's or request's, altered, or signed with an unknown key)."""
        parts = {name: data for name, data in signed.items() if name != SIGNATURE_PART}
        signature = signed.get(SIGNATURE_PART)
        if signature is None:
            return None
        for key in self._keys:
            expected = self._mac(key, job_id, digest, parts).encode()
            if hmac.compare_digest(expected, signature):
                return parts
        return None

    def sign_stage(self, job_id: str, digest: str, core: bytes) -> bytes:
        """A running analysis' per-head stage as stored: signature, newline, core part."""
        return self.sign(job_id, digest, {HEADS_STAGE_PART: core}) + b"\n" + core

    def verify_stage(self, job_id: str, digest: str, stored: bytes) -> bytes | None:
        """The core part of a stored per-head stage if its signature holds, else None."""
        signature, _, core = stored.partition(b"\n")
        signed = {HEADS_STAGE_PART: core, SIGNATURE_PART: signature}
        return core if self.verify(job_id, digest, signed) is not None else None


def parse_keys(text: str) -> list[bytes]:
    """The keys of an `ICL_RESULT_KEYS` value (comma-separated, blanks ignored)."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    short = [n for n, key in enumerate(keys, 1) if len(key) < MIN_KEY_CHARS]
    if short:
        raise SigningKeyError(
            f"ICL_RESULT_KEYS: key {short[0]} has fewer than {MIN_KEY_CHARS} characters "
            "(use e.g. `openssl rand -hex 32`)"
        )
    return [key.encode() for key in keys]


def result_signer(settings: Settings) -> ResultSigner:
    """The signer of `settings` (`ICL_RESULT_KEYS`), or the development key's when unset."""
    text = settings.result_keys.get_secret_value() if settings.result_keys else ""
    keys = parse_keys(text)
    if not keys:
        return ResultSigner([DEVELOPMENT_KEY], configured=False)
    return ResultSigner(keys)
