"""One settings class for the web tier and the worker: `ICL_*` environment variables or `.env`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from model_worker.common.defaults import (
    DEFAULT_CACHE_DIR,
    DEFAULT_HEAD_UNEMBEDDING_BYTES,
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_MODEL,
    DEVICE_PATTERN,
    DType,
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ICL_", env_file=".env", extra="ignore")

    model: str = Field(DEFAULT_MODEL, description="Model id, local path or GGUF file to serve.")
    device: str = Field(
        "auto", pattern=DEVICE_PATTERN, description="auto, cpu, mps, cuda or cuda:N."
    )
    dtype: DType = Field("auto", description="auto, float32, bfloat16 or float16.")
    head_unembedding_mb: int = Field(
        DEFAULT_HEAD_UNEMBEDDING_BYTES // 2**20,
        ge=0,
        description="MiB of recurring heads' factored unembeddings a worker keeps (0: none).",
    )
    max_prompt_tokens: int = Field(
        DEFAULT_MAX_PROMPT_TOKENS, ge=1, description="Longest prompt analysed, in tokens."
    )
    cache_dir: Path = Field(
        DEFAULT_CACHE_DIR, description="Converted model weights and other on-disk caches."
    )
    warm_up: bool = Field(
        True, description="Analyse a built-in prompt twice at start-up (first request at speed)."
    )
    redis_url: str | None = Field(None, description="Redis URL; unset = embedded single process.")
    cache_redis_url: str | None = Field(
        None,
        description="Redis URL for finished results on their way to the web tier: a cache "
        "apart from the queue (maxmemory + allkeys-lru, so a full cache evicts instead of "
        "refusing writes); unset = the queue's Redis.",
    )
    result_ttl_s: int = Field(
        3600,
        ge=1,
        description="How long a worker's result waits in Redis for the web tier (the durable "
        "store keeps it; Redis is only the hand-over and a short cache).",
    )
    job_timeout_s: int = Field(600, ge=1, description="A job running longer fails.")
    queue_cap: int = Field(100, ge=1, description="Queued jobs per model before 429.")
    experiment_timeout_s: int = Field(4 * 3600, ge=1, description="Timeout of experiment jobs.")
    experiment_chunk_s: float = Field(
        20.0,
        gt=0,
        description="About how long one chunk of an experiment runs on a lab server's worker "
        "before it hands the worker back (interactive jobs go first between chunks).",
    )
    worker_heartbeat_s: float = Field(
        2.0, gt=0, description="Worker heartbeat period; a worker silent for 5 periods is dead."
    )
    redis_timeout_s: float = Field(
        2.0, gt=0, description="Web tier's Redis connect/read timeout (then 503)."
    )
    host: str = Field("127.0.0.1", description="Address `icl-heads serve` binds to.")
    port: int = Field(8000, ge=1, le=65535)
    auth_token: SecretStr | None = Field(
        None, description="Shared access token; unset = no login (only safe on 127.0.0.1)."
    )
    users: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Named users, JSON {name: token}: a user's token (bearer or login) names "
        "them, and every per-client bound (rate limits, queue shares, fair-queue priority, "
        "long polls) keys on that user instead of the address; beside or instead of "
        "ICL_AUTH_TOKEN.",
    )
    users_file: Path | None = Field(
        None,
        description="A file of named users, one `name token` per line (# comments): the same "
        "as ICL_USERS, the tokens kept out of the environment.",
    )
    session_max_age_s: int = Field(12 * 3600, ge=60, description="Login cookie lifetime.")
    trusted_origins: list[str] = Field(
        default_factory=list, description="Extra origins allowed to post (a reverse proxy's)."
    )
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="Largest request body (413).")
    max_upload_bytes: int = Field(
        6 * 1024 * 1024, ge=1024, description="Largest multipart upload body (413)."
    )
    rate_limit_per_minute: int = Field(
        1200, ge=0, description="Requests per client and minute (429); 0 = unlimited."
    )
    write_rate_limit_per_minute: int = Field(
        60, ge=0, description="POST/PUT/PATCH/DELETE per client and minute; 0 = unlimited."
    )
    # --- what one request and one client may cost; where results are kept (issue 14) ---
    max_analysis_cost: int = Field(
        300_000,
        ge=1,
        description="Budget of one analysis: tokens × detailed heads × (2 × top_k_tokens + 4).",
    )
    max_experiment_n: int = Field(1000, ge=1, description="Most prompts one experiment runs.")
    max_patch_cost: int = Field(
        150_000,
        ge=1,
        description="Budget of one patching job: forward passes × prompt tokens.",
    )
    client_queued_jobs: int = Field(
        20, ge=1, description="Analyses one client may have queued or running (429 beyond)."
    )
    client_experiments: int = Field(
        2,
        ge=1,
        description="Batch jobs (experiments and patching) one client may have queued or "
        "running (429 beyond).",
    )
    result_memory_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="Embedded: bytes of results kept in memory."
    )
    data_dir: Path = Field(
        Path.home() / ".local" / "share" / "icl-heads",
        description="Durable store's folder (SQLite `results.sqlite3`).",
    )
    database_url: str | None = Field(
        None, description="postgresql://… for a durable store shared by several web replicas."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A client must send a request's headers within this time."
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="Time a client has to send a request's body (then 408)."
    )
    # --- slow readers, long polls: bounds per client and in total (issue 24.5, 24.9) ---
    send_timeout_s: float = Field(
        20.0,
        gt=0,
        description="A client that takes under 1 KiB/s of a response for this long is cut off.",
    )
    stalled_send_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Response bytes all stalled readers together may hold (oldest cut beyond).",
    )
    client_connections: int = Field(
        32,
        ge=1,
        description="Open connections per client address (IPv6: per /64), over every web "
        "process with ICL_REDIS_URL; 429 beyond.",
    )
    figure_files_per_minute: int = Field(
        120,
        ge=0,
        description="Figure files (SVG, PNG, CSV, JSON) one client may download a minute "
        "(429 beyond; 0 = only the general rate limit).",
    )
    client_requests: int = Field(
        64,
        ge=0,
        description="Requests one client (named user, else address) may have in flight at once, "
        "over every web process with ICL_REDIS_URL (429 beyond; 0 = no limit).",
    )
    client_renders: int = Field(
        2,
        ge=1,
        description="Figure files (SVG, PNG) one client may have drawing at once, over every "
        "web process with ICL_REDIS_URL; 429 beyond.",
    )
    client_long_polls: int = Field(
        16, ge=1, description="Concurrent long polls (?wait=) per client; 429 beyond."
    )
    refusal_delay_s: float = Field(
        1.0,
        ge=0,
        le=10,
        description="A 429 is sent this many seconds after it is decided (at most its "
        "Retry-After): a client looping on refusals gets about one a second per connection; "
        "0 = at once.",
    )

    # --- who may reach the server, and as whom (issue 14) ---
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Reverse proxies whose X-Forwarded-For/-Proto are believed; empty = none.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names served beyond localhost, 127.0.0.1, [::1] and ICL_HOST.",
    )
    login_failures_per_client: int = Field(
        10, ge=1, description="Failed logins per client address in 15 minutes before 429."
    )
    login_failures_per_account: int = Field(
        100, ge=1, description="Failed logins (all clients) in 15 minutes that mean an attack."
    )

    # --- results authenticated, workers waited for, the store bounded (issue 24) ---
    result_keys: SecretStr | None = Field(
        None,
        description="Comma-separated secrets (16+ characters) shared by the web tier and the "
        "workers: the first signs results, each one is accepted (rotation). Unset: a known "
        "development key (results are not authenticated; refused for a public bind).",
    )
    worker_grace_s: float = Field(
        300.0,
        ge=0,
        description="How long queued jobs (and submissions) of a model wait for a worker of it "
        "after its last heartbeat (a rolling restart, a Redis restart) before failing.",
    )
    store_max_bytes: int = Field(
        20 * 2**30,
        ge=0,
        description="Bytes the durable store may hold; the oldest unpinned results go first "
        "(0 = unbounded).",
    )
    pin_max_bytes: int = Field(
        2 * 2**30,
        ge=0,
        description="Bytes all pinned results may hold: their own room within "
        "ICL_STORE_MAX_BYTES (at most half of it), never taken from unpinned results.",
    )
    pin_max_bytes_per_user: int = Field(
        256 * 2**20,
        ge=0,
        description="Bytes the results one client (named user or address) pinned may hold "
        "(0 = no cap).",
    )
    admins: list[str] = Field(
        default_factory=list,
        description="Named users (ICL_USERS) who may cancel anyone's job and un-pin anyone's pins.",
    )
    store_max_age_days: float = Field(
        0.0,
        ge=0,
        description="Unpinned results older than this are deleted from the store (0 = kept).",
    )


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
