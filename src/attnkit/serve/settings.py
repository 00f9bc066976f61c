"""The limits and batching of a server, each with a default a small CPU server can keep."""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.checks import finite_fields, non_negative, positive, positive_int


@dataclass(frozen=True)
class ServeSettings:
    """How `attnkit serve` batches and what it refuses.

    batch_wait_ms: how long a request waits for others with the same decoding
        options to share its decode (0: each request decodes alone).
    max_batch: requests decoded together at most.
    max_input_tokens: the longest prompt or source (each model's max_len bounds it too).
    max_new_tokens: the most tokens a request may ask for.
    max_texts: texts in one request at most (prompts, inputs, sources).
    max_concurrent: requests in flight at once; one more is answered 429.
    timeout_s: a request's longest wait for its result; then 504.
    api_key: if set, every /v1 request must send `Authorization: Bearer <key>`.
    """

    batch_wait_ms: float = 5.0
    max_batch: int = 16
    max_input_tokens: int = 1024
    max_new_tokens: int = 512
    max_texts: int = 64
    max_concurrent: int = 64
    timeout_s: float = 120.0
    api_key: str | None = None

    def __post_init__(self) -> None:
        finite_fields(self, "serve")
        non_negative("batch_wait_ms", self.batch_wait_ms)
        positive("timeout_s", self.timeout_s)
        for name in (
            "max_batch",
            "max_input_tokens",
            "max_new_tokens",
            "max_texts",
            "max_concurrent",
        ):
            positive_int(name, getattr(self, name))
