"""`attnkit serve`: run folders behind an HTTP API that OpenAI's clients speak.

    GET  /v1/models        the runs served, by name
    POST /v1/completions   a decoder's continuation of a prompt (OpenAI's shape; stream: true)
    POST /v1/embeddings    an encoder's sentence vectors (OpenAI's shape)
    POST /v1/translate     an encoder-decoder's translations of a batch of texts
    POST /v1/attention     every attention weight of one text and its output, for the viewer
    GET  /health, /metrics requests, tokens and latency in Prometheus's text format
    GET  /                 the page: run a model, watch it stream, look at its attention

`app.py` (`create_app`) holds the routes, `guard.py` the key, the in-flight limit
and the errors, `settings.py` the limits, `batching.py` the gathering of
concurrent requests into one decode, `events.py` streaming, `work.py` what a
batch does with a model, `metrics.py` the counters, `page.py` the page. The
modules that import FastAPI need the `serve` extra; `settings` and `work` do not.
"""
