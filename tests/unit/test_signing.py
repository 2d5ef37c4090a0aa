"""Results signed by workers, checked by the web tier (issue 24.1):
model_worker.service.queue.signing."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.service.queue.signing import (
    SIGNATURE_PART,
    ResultSigner,
    SigningKeyError,
    request_digest,
    result_signer,
)

OLD, NEW = b"old-key-0123456789abcdef", b"new-key-0123456789abcdef"
REQUEST = AnalysisRequest(prompt="cat : foo dog : bar cat :")
PARTS = {"core": b'{"tokens": []}', "mrr": b"{}", "h:L0H1": b'{"value": 1}'}


def test_a_signed_result_verifies_and_loses_its_signature() -> None:
    signer = ResultSigner([NEW])
    signed = signer.signed("a-1", request_digest(REQUEST), PARTS)
    assert SIGNATURE_PART in signed
    assert signer.verify("a-1", request_digest(REQUEST), signed) == PARTS


@pytest.mark.parametrize(
    "forgery",
    [
        lambda signed: {k: v for k, v in signed.items() if k != SIGNATURE_PART},  # unsigned
        lambda signed: {**signed, "core": b'{"tokens": ["forged"]}'},  # altered part
        lambda signed: {**signed, "h:L9H9": b"{}"},  # a part added
        lambda signed: {k: v for k, v in signed.items() if k != "h:L0H1"},  # a part removed
        lambda signed: {**signed, SIGNATURE_PART: b"0" * 64},  # a made-up signature
        lambda signed: {"core" + "mrr": b"", SIGNATURE_PART: signed[SIGNATURE_PART]},
    ],
)
def test_any_change_breaks_the_signature(forgery: object) -> None:
    signer = ResultSigner([NEW])
    signed = signer.signed("a-1", request_digest(REQUEST), PARTS)
    assert signer.verify("a-1", request_digest(REQUEST), forgery(signed)) is None  # type: ignore[operator]


def test_a_result_is_bound_to_its_job_and_request() -> None:
    signer = ResultSigner([NEW])
    signed = signer.signed("a-1", request_digest(REQUEST), PARTS)
    other = AnalysisRequest(prompt="cat : foo dog : bar dog :")
    assert signer.verify("a-2", request_digest(REQUEST), signed) is None
    assert signer.verify("a-1", request_digest(other), signed) is None


def test_keys_rotate_the_first_signs_each_is_accepted() -> None:
    digest = request_digest(REQUEST)
    by_old_worker = ResultSigner([OLD]).signed("a-1", digest, PARTS)
    rotating = ResultSigner([NEW, OLD])
    assert rotating.verify("a-1", digest, by_old_worker) == PARTS
    assert ResultSigner([OLD]).verify("a-1", digest, rotating.signed("a-1", digest, PARTS)) is None
    assert ResultSigner([NEW]).verify("a-1", digest, by_old_worker) is None  # OLD retired


def test_the_per_head_stage_is_signed_too() -> None:
    signer, digest = ResultSigner([NEW]), request_digest(REQUEST)
    stored = signer.sign_stage("a-1", digest, b'{"core": 1}\nwith a newline')
    assert signer.verify_stage("a-1", digest, stored) == b'{"core": 1}\nwith a newline'
    assert signer.verify_stage("a-2", digest, stored) is None
    assert signer.verify_stage("a-1", digest, b'{"core": "forged"}') is None


def test_keys_come_from_the_settings() -> None:
    settings = Settings(result_keys=SecretStr(f" {NEW.decode()} , {OLD.decode()} "))
    signer = result_signer(settings)
    assert signer.configured
    assert ResultSigner([OLD]).verify(
        "a-1", "d", signer.signed("a-1", "d", PARTS)
    ) is None and ResultSigner([NEW]).verify("a-1", "d", signer.signed("a-1", "d", PARTS))
    with pytest.raises(SigningKeyError, match="fewer than 16"):
        result_signer(Settings(result_keys=SecretStr("short")))
    assert not result_signer(Settings()).configured  # the development key: nothing authenticated


def test_a_public_server_in_redis_mode_needs_result_keys() -> None:
    from app.security.bind import bind_refusal

    token = "kR3v-9xQ_t2LmZ8pW4sN"
    redis = {"auth_token": token, "redis_url": "redis://127.0.0.1:6379/0"}
    refusal = bind_refusal("0.0.0.0", Settings(**redis))
    assert refusal is not None and "ICL_RESULT_KEYS" in refusal
    assert bind_refusal("0.0.0.0", Settings(**redis, result_keys=SecretStr(NEW.decode()))) is None
    assert bind_refusal("127.0.0.1", Settings(**redis)) is None  # local: the dev key will do
    assert bind_refusal("0.0.0.0", Settings(auth_token=token)) is None  # embedded: no Redis
