"""The limits, batching and operations of a server, each with a default a small CPU server keeps."""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.checks import check, choice, finite_fields, non_negative, positive, positive_int
from attnkit.generation.config import CACHES


@dataclass(frozen=True)
class ServeSettings:
    """How `attnkit serve` batches, what it refuses, and what it tells its operator.

    max_batch: rows decoded together at most (outputs of streams and plain requests
        alike, iteration-level); more wait for a row to end. 1 decodes one at a time.
    cache_implementation: the KV cache of the rows (`GenerationConfig`'s): `auto`, the static
        cache as paged memory on a CUDA device and the dynamic one elsewhere; `dynamic`;
        `static`, paged memory with a step compiled for each batch size, on any device.
    kv_blocks: where rows decode on paged memory (a GPU's default), the blocks of 16
        positions each model's pool holds (None: max_batch rows of its max_len); with fewer,
        a row waits until the blocks its longest output may need are free.
    batch_wait_ms: how long an embedding or beam-search request waits for others with
        the same options to share its batch (0: each runs alone).
    max_input_tokens: the longest prompt or source (each model's max_len bounds it too).
    max_new_tokens: the most tokens a request may ask for (and what a chat gets by default).
    max_texts: texts in one request at most (prompts, inputs, sources).
    max_request_tokens: the new tokens one request may ask for in all, prompts x outputs
        (n, best_of, a beam's or n-best's width) x max_tokens: its bound on one request's work.
    max_concurrent: /v1 requests in flight at once; one more is answered 429 with
        Retry-After. /health, /ready, /metrics and the page never count.
    max_body_bytes: the largest request body; a larger one is answered 413 before it is read.
    body_timeout_s: how long a request's body may take to arrive whole; then 408, so clients
        sending bytes slowly cannot hold every in-flight place.
    timeout_s: a request's longest wait for its result (a stream's, for its next token);
        then 504.
    api_key: if set, every /v1 request must send `Authorization: Bearer <key>`.
    cors_origins: origins whose pages may call the API from a browser (`*`: any).
    access_log: one log line per request (method, path, status, seconds, request id).
    """

    max_batch: int = 32
    cache_implementation: str = "auto"
    kv_blocks: int | None = None
    batch_wait_ms: float = 5.0
    max_input_tokens: int = 1024
    max_new_tokens: int = 512
    max_texts: int = 64
    max_request_tokens: int = 65536
    max_concurrent: int = 64
    max_body_bytes: int = 2 * 1024 * 1024
    body_timeout_s: float = 30.0
    timeout_s: float = 120.0
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    access_log: bool = True

    def __post_init__(self) -> None:
        finite_fields(self, "serve")
        non_negative("batch_wait_ms", self.batch_wait_ms)
        positive("timeout_s", self.timeout_s)
        positive("body_timeout_s", self.body_timeout_s)
        for name in (
            "max_batch",
            "max_input_tokens",
            "max_new_tokens",
            "max_texts",
            "max_request_tokens",
            "max_concurrent",
            "max_body_bytes",
        ):
            positive_int(name, getattr(self, name))
        choice("cache_implementation", self.cache_implementation, CACHES)
        if self.kv_blocks is not None:
            positive_int("kv_blocks", self.kv_blocks)
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        for origin in self.cors_origins:
            check(
                origin == "*" or origin.startswith(("http://", "https://")),
                f"a CORS origin is a page's scheme and host, such as https://example.com, or *; "
                f"got {origin!r}",
            )
