"""What the server has done, in Prometheus's text format (`GET /metrics`).

attnkit_requests_total{path, status}      requests answered
attnkit_request_seconds_sum / _count      their latency, summed, by path
attnkit_prompt_tokens_total, attnkit_completion_tokens_total
attnkit_batches_total, attnkit_batched_requests_total   decodes run and the items they held
attnkit_requests_in_flight
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class Metrics:
    """Counters of requests (by route and status), their seconds, tokens read and written."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.seconds: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def count(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        self.seconds[path] += seconds

    def tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    def text(self, batcher: Any, in_flight: int) -> str:
        lines = ["# TYPE attnkit_requests_total counter"]
        lines += [
            f'attnkit_requests_total{{path="{path}",status="{status}"}} {n}'
            for (path, status), n in sorted(self.requests.items())
        ]
        lines.append("# TYPE attnkit_request_seconds summary")
        for path in sorted(self.seconds):
            calls = sum(n for (p, _), n in self.requests.items() if p == path)
            lines.append(f'attnkit_request_seconds_sum{{path="{path}"}} {self.seconds[path]:.6f}')
            lines.append(f'attnkit_request_seconds_count{{path="{path}"}} {calls}')
        lines += [
            "# TYPE attnkit_prompt_tokens_total counter",
            f"attnkit_prompt_tokens_total {self.prompt_tokens}",
            "# TYPE attnkit_completion_tokens_total counter",
            f"attnkit_completion_tokens_total {self.completion_tokens}",
            "# TYPE attnkit_batches_total counter",
            f"attnkit_batches_total {batcher.batches}",
            "# TYPE attnkit_batched_requests_total counter",
            f"attnkit_batched_requests_total {batcher.items}",
            "# TYPE attnkit_requests_in_flight gauge",
            f"attnkit_requests_in_flight {in_flight}",
        ]
        return "\n".join(lines) + "\n"
