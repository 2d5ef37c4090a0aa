"""A client for a shared `icl-heads serve` (no torch): submit, wait with a progress bar, and get
back the same result types as the local API.

Finished results are cached in this process by request and by job id (ids are content hashes:
a result never changes), so re-running a notebook cell does not submit again. 429 and 503
answers are retried politely, after their `Retry-After`.
"""

from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from icl_heads.results import AnalysisResult, ExperimentResult
from icl_heads.study import Study
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.experiments import DEFAULT_N, ExperimentRequest
from model_worker.contracts.patching import PatchingResult, PatchRequest
from model_worker.contracts.studies import StudyRequest
from model_worker.service.queue.states import JobState, JobStatus, ModelInfo, StudyState

R = TypeVar("R", AnalysisResult, ExperimentResult, PatchingResult)
RETRIED = (429, 503)
#: An unreachable server is more often a wrong URL than a blip: retried less.
CONNECT_RETRIES = 2


class ClientError(Exception):
    """The server refused a request or a job failed; `status` is the HTTP status, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthError(ClientError):
    """401/403: no token, or the wrong one (set `token=` or `ICL_AUTH_TOKEN`)."""


class NotFound(ClientError):
    """404: no live worker for the model, or an unknown or expired job id."""


class InvalidRequest(ClientError):
    """400/413/422: the server rejected the request; the message says why."""


class ServerUnavailable(ClientError):
    """The server (or its job queue) stayed unreachable or busy through every retry."""


class JobFailed(ClientError):
    """The job ran and failed (e.g. labels not in the prompt, a timeout); its error message."""


class ResultCache:
    """Finished results by job id and job ids by request, the most recent `size` of each."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._results: OrderedDict[str, BaseModel] = OrderedDict()
        self._ids: OrderedDict[str, str] = OrderedDict()

    @staticmethod
    def _put(store: OrderedDict[str, Any], key: str, value: Any, size: int) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > size:
            store.popitem(last=False)

    def result(self, job_id: str) -> BaseModel | None:
        return self._results.get(job_id)

    def job_id(self, request_key: str) -> str | None:
        return self._ids.get(request_key)

    def store(self, request_key: str | None, job_id: str, result: BaseModel) -> None:
        self._put(self._results, job_id, result, self.size)
        if request_key is not None:
            self._put(self._ids, request_key, job_id, self.size)


#: Shared by every Client of this process, so a cell that builds a new Client still hits it.
CACHE = ResultCache()


def _detail(response: httpx.Response) -> str:
    """The server's error message: FastAPI's `detail` (a string or a list of field errors)."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text.strip()[:300] or response.reason_phrase
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', []) if p != 'body')}: {item.get('msg')}"
            for item in detail
            if isinstance(item, dict)
        )
    return str(detail)


def _retry_after(response: httpx.Response | None, attempt: int) -> float:
    """Seconds to wait: the server's Retry-After (capped at 60 s), else 1, 2, 4 … s."""
    header = response.headers.get("retry-after") if response is not None else None
    try:
        return min(max(float(header), 0.0), 60.0) if header else float(min(2**attempt, 30))
    except ValueError:
        return float(min(2**attempt, 30))


class Client:
    """Analyses and experiments on an `icl-heads serve` server.

    `token` defaults to `ICL_AUTH_TOKEN`. `progress` shows a bar (on stderr) while a job runs.
    Raises AuthError (401/403), NotFound (404), InvalidRequest (400/413/422), JobFailed,
    ServerUnavailable (still 429/503 or unreachable after `retries` polite retries).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        poll_interval: float = 0.5,
        progress: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get("ICL_AUTH_TOKEN") or None
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.retries = retries
        self.poll_interval = poll_interval
        self.progress = progress
        self.cache = CACHE
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        #: How the client waits between retries and polls (tests record it instead).
        self.sleep: Callable[[float], None] = time.sleep

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public API -----------------------------------------------------------------------

    def models(self) -> list[ModelInfo]:
        """The models that have a live worker on the server."""
        data = self._request("GET", "/api/models").json()
        return [ModelInfo.model_validate(item) for item in data]

    def analyze(
        self, prompt: str, *, timeout: float | None = None, **options: Any
    ) -> AnalysisResult:
        """Analyse `prompt` on the server. `options`: AnalysisRequest's fields, with its
        defaults (model, target, labels, norm, top_k_heads, top_k_tokens, extra_heads, rank_by:
        the keywords of `icl_heads.analyze`); None leaves a field at its default. `timeout`:
        seconds to wait for the job (None: no limit)."""
        fields = {name: value for name, value in options.items() if value is not None}
        request = self._build(AnalysisRequest, prompt=prompt, **fields)
        return self._run("/api/analyses", request, AnalysisResult, timeout)

    def experiment(
        self,
        name: str,
        dataset: str | Path = "sentiment-number",
        *,
        model: str | None = None,
        n: int = 200,
        seed: int = 0,
        timeout: float | None = None,
        **options: Any,
    ) -> ExperimentResult:
        """Run dataset experiment `name` on the server. `dataset` is a built-in name or a local
        CSV/JSONL file (sent inline); `options`: any other field of ExperimentRequest."""
        fields: dict[str, Any] = {"name": name, "model": model, "n": n, "seed": seed, **options}
        path = Path(dataset)
        if isinstance(dataset, Path) or (path.suffix.lower() in (".csv", ".jsonl")):
            if not path.is_file():
                raise InvalidRequest(f"no dataset file {str(path)!r}")
            text = path.read_text(encoding="utf-8-sig")
            fields |= {"dataset": "upload", "dataset_text": text, "dataset_filename": path.name}
        else:
            fields["dataset"] = str(dataset)
        request = self._build(ExperimentRequest, **fields)
        return self._run("/api/experiments", request, ExperimentResult, timeout)

    def patch(
        self,
        prompt: str,
        corruption: str = "swap-labels",
        *,
        timeout: float | None = None,
        **options: Any,
    ) -> PatchingResult:
        """Activation patching of `prompt` against its corruption on the server (`swap-labels`,
        `query`, or `prompt` with `corrupted_prompt=`); `options`: PatchRequest's other fields
        (model, target, labels, top_k, heads, qkv_heads, directions). A pair the server cannot
        patch raises InvalidRequest with its one sentence."""
        fields = {name: value for name, value in options.items() if value is not None}
        request = self._build(PatchRequest, prompt=prompt, corruption=corruption, **fields)
        return self._run("/api/patch", request, PatchingResult, timeout)

    def study(
        self,
        experiments: Sequence[str] | None = None,
        datasets: Sequence[str] = ("sentiment-number",),
        *,
        seeds: Sequence[int] = (0,),
        n: int = DEFAULT_N,
        model: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> Study:
        """Run a study on the server (`POST /api/studies`): `experiments` (default: the paper's)
        on every built-in dataset of `datasets`, every seed of `seeds` pooled in each;
        `options`: the design (locate_by, correct_only, design, demos_per_label, labels). The
        server submits its experiment jobs within this client's share of batch work; the bar
        shows one fraction over all of them. Its results document and results once done."""
        fields: dict[str, Any] = {"datasets": list(datasets), "seeds": list(seeds), "n": n}
        fields |= {"model": model, **options}
        if experiments is not None:
            fields["experiments"] = list(experiments)
        request = self._build(StudyRequest, **fields)
        answer = self._request("POST", "/api/studies", json=request.model_dump(mode="json"))
        state = self._study_state(answer)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._bar(state.id, True) as show:
            interval = min(0.1, self.poll_interval)
            while state.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                show(JobState.model_validate(state.model_dump(exclude={"jobs", "document"})))
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"study {state.id} still {state.status} after {timeout} s")
                self.sleep(interval)
                interval = min(interval * 1.5, self.poll_interval)
                state = self._study_state(self._request("GET", f"/api/studies/{state.id}"))
        if state.status == JobStatus.FAILED or state.document is None:
            raise JobFailed(f"study {state.id} failed: {state.error}")
        document = self._request("GET", state.document).text
        results = [self.wait(job.id or "") for job in state.jobs]
        return Study(state.id, document, [r for r in results if isinstance(r, ExperimentResult)])

    @staticmethod
    def _study_state(response: httpx.Response) -> StudyState:
        try:
            return StudyState.model_validate(response.json(), extra="ignore")
        except (ValueError, ValidationError) as exc:
            raise ClientError(f"unexpected answer from the server: {str(exc)[:300]}") from None

    def submit(self, request: AnalysisRequest | ExperimentRequest) -> JobState:
        """Submit without waiting: the job's state (its `id` for `wait`)."""
        path = "/api/analyses" if isinstance(request, AnalysisRequest) else "/api/experiments"
        return self._state(self._request("POST", path, json=request.model_dump(mode="json")))

    def wait(self, job_id: str, timeout: float | None = None) -> AnalysisResult | ExperimentResult:
        """The result of job `job_id` (`a-…` analysis, `e-…` experiment), once it is done."""
        cached = self.cache.result(job_id)
        if isinstance(cached, AnalysisResult | ExperimentResult):
            return cached
        if job_id.startswith("e-"):
            return self._finish(self._poll(job_id), ExperimentResult, None, timeout)
        return self._finish(self._poll(job_id), AnalysisResult, None, timeout)

    def cancel(self, job_id: str) -> JobState:
        """Cancel a queued or running job or study (`s-…`: each job it has queued or running)
        you submitted (an admin: anyone's): a queued one leaves the queue at once, a running
        one stops within one slice of its work and keeps nothing; its state then says
        `cancelled by …`. NotFound for an unknown job; ClientError (409) for one already
        finished."""
        return self._state(self._request("DELETE", f"/api/jobs/{job_id}"))

    # --- internals ------------------------------------------------------------------------

    @staticmethod
    def _build(kind: type[BaseModel], **fields: Any) -> Any:
        try:
            return kind(**fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidRequest(problems) from None

    def _run(
        self,
        path: str,
        request: AnalysisRequest | ExperimentRequest | PatchRequest,
        kind: type[R],
        timeout: float | None,
    ) -> R:
        key = f"{self.url} {path} {request.model_dump_json()}"
        job_id = self.cache.job_id(key)
        cached = self.cache.result(job_id) if job_id else None
        if isinstance(cached, kind):
            return cached
        state = self._state(self._request("POST", path, json=request.model_dump(mode="json")))
        return self._finish(state, kind, key, timeout)

    def _finish(self, state: JobState, kind: type[R], key: str | None, timeout: float | None) -> R:
        """Poll until `state`'s job ends; its result, cached."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._bar(state.id, kind is not AnalysisResult) as show:
            interval = min(0.1, self.poll_interval)
            while state.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                show(state)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {state.id} still {state.status} after {timeout} s")
                self.sleep(interval)
                interval = min(interval * 1.5, self.poll_interval)
                state = self._poll(state.id)
            show(state)
        if state.status == JobStatus.FAILED:
            raise JobFailed(f"job {state.id} failed: {state.error}")
        if kind is PatchingResult:  # the contract itself: no local wrapper
            if state.patching is None:
                raise ClientError(f"job {state.id} finished without a PatchingResult")
            self.cache.store(key, state.id, state.patching)
            return state.patching  # type: ignore[return-value]
        found = state.experiment if kind is ExperimentResult else state.result
        if found is None:
            raise ClientError(f"job {state.id} finished without a {kind.__name__}")
        result = kind.of(found)  # type: ignore[arg-type,attr-defined]
        self.cache.store(key, state.id, result)
        return result

    def _poll(self, job_id: str) -> JobState:
        return self._state(self._request("GET", f"/api/analyses/{job_id}"))

    @staticmethod
    def _state(response: httpx.Response) -> JobState:
        """The JobState of an answer, ignoring fields a newer server may add."""
        try:
            return JobState.model_validate(response.json(), extra="ignore")
        except (ValueError, ValidationError) as exc:
            raise ClientError(f"unexpected answer from the server: {str(exc)[:300]}") from None

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP request, retried on 429/503 and connection failures; errors raised typed."""
        for attempt in range(self.retries + 1):
            response: httpx.Response | None = None
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                problem = f"cannot reach {self.url}: {exc}"
                last = attempt >= min(self.retries, CONNECT_RETRIES)
            else:
                if response.status_code not in RETRIED:
                    break
                problem = f"{response.status_code}: {_detail(response)}"
                last = attempt == self.retries
            if last:
                status = response.status_code if response is not None else None
                raise ServerUnavailable(f"{problem} (gave up after {attempt} retries)", status)
            self.sleep(_retry_after(response, attempt))
        assert response is not None
        if response.status_code < 400:
            return response
        message = f"{response.status_code}: {_detail(response)}"
        if response.status_code in (401, 403):
            raise AuthError(f"{message} (set token= or ICL_AUTH_TOKEN)", response.status_code)
        if response.status_code == 404:
            raise NotFound(message, 404)
        if response.status_code in (400, 413, 422):
            raise InvalidRequest(message, response.status_code)
        raise ClientError(message, response.status_code)

    @contextmanager
    def _bar(self, job_id: str, fractional: bool) -> Iterator[Callable[[JobState], None]]:
        """A tqdm bar on stderr, shown once a job is not finished at its first look."""
        if not self.progress:
            yield lambda state: None
            return
        from tqdm.std import tqdm

        bar: tqdm[Any] | None = None

        def show(state: JobState) -> None:
            nonlocal bar
            if bar is None:
                if state.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                    return
                total = 100 if fractional else None
                bar = tqdm(total=total, desc=job_id[:14], file=sys.stderr, leave=True)
            where = f" ({state.position_in_queue} ahead)" if state.position_in_queue else ""
            bar.set_postfix_str(f"{state.status}{where} {state.message or ''}".strip())
            if fractional:
                done = 100 if state.status == JobStatus.DONE else int(100 * (state.progress or 0))
                bar.update(max(done - bar.n, 0))

        try:
            yield show
        finally:
            if bar is not None:
                bar.close()
