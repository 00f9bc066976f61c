"""What the server has done, for Prometheus (`GET /metrics`, prometheus-client's text format).

    attnkit_requests_total{path, status}            requests answered
    attnkit_request_duration_seconds{path, model}   their latency (histogram; model "" where
                                                    a request names none the server has)
    attnkit_time_to_first_token_seconds             a request's arrival to an output's first token
    attnkit_prompt_tokens_total{model}, attnkit_completion_tokens_total{model}
    attnkit_generation_tokens_per_second            tokens chosen a second, over the last 10 s
    attnkit_queue_length                            outputs waiting to join the running batch
    attnkit_running_rows                            rows decoding at the last step
    attnkit_decode_steps_total                      decoding steps (one per running batch)
    attnkit_batches_total, attnkit_batched_requests_total  embedding and beam batches, items
    attnkit_requests_in_flight                      /v1 requests being answered
    process_*                                       the process's CPU seconds, memory, files

What only grows (steps, batches, the items they held) is a counter, read from the
scheduler and the batcher at each scrape (`counter`); what goes up and down is a gauge.

Each server keeps its own registry, so several in one process never mix. The
`_created` series prometheus-client adds by default are turned off (process-wide):
they double the output and no dashboard reads them.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
RATE_WINDOW_S = 10.0

disable_created_metrics()


class Metrics:
    """The server's counters, histograms and gauges, in one registry."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "attnkit_requests", "Requests answered.", ["path", "status"], registry=registry
        )
        self.latency = Histogram(
            "attnkit_request_duration_seconds",
            "Seconds from a request's arrival to the last byte of its answer.",
            ["path", "model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.first_token = Histogram(
            "attnkit_time_to_first_token_seconds",
            "Seconds from a request's arrival to its output's first token.",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "attnkit_prompt_tokens", "Tokens read from prompts.", ["model"], registry=registry
        )
        self.completion_tokens = Counter(
            "attnkit_completion_tokens", "Tokens generated.", ["model"], registry=registry
        )
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, memory, open files
        self._gauges: dict[str, Gauge] = {}
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def gauge(self, name: str, about: str, read: Callable[[], float]) -> None:
        """A gauge whose value `read` gives at each scrape."""
        gauge = Gauge(name, about, registry=self.registry)
        gauge.set_function(read)
        self._gauges[name] = gauge

    def counter(self, name: str, about: str, read: Callable[[], float]) -> None:
        """A counter (`name` without `_total`) whose running total `read` gives at each
        scrape: typed as a counter, so that rate() and resets read it right."""
        self.registry.register(_ReadCounter(name, about, read))

    def count(self, path: str, status: int, seconds: float, model: str = "") -> None:
        self.requests.labels(path, str(status)).inc()
        self.latency.labels(path, model).observe(seconds)

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        self.prompt_tokens.labels(model).inc(prompt)
        self.completion_tokens.labels(model).inc(completion)

    def rate(self, total: int) -> float:
        """Tokens a second over the last `RATE_WINDOW_S`, given the running `total` chosen."""
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, total))
            while len(self._samples) > 1 and now - self._samples[1][0] >= RATE_WINDOW_S:
                self._samples.popleft()
            then, before = self._samples[0]
        return (total - before) / (now - then) if now > then else 0.0

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _ReadCounter(Collector):
    """One counter whose value is read when scraped."""

    def __init__(self, name: str, about: str, read: Callable[[], float]) -> None:
        self.name, self.about, self.read = name, about, read

    def collect(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self.name, self.about, value=self.read())]
