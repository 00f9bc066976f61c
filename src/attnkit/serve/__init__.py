"""`attnkit serve`: run folders behind an HTTP API that OpenAI's clients speak.

    GET  /v1/models        the runs served, by name
    POST /v1/completions   a decoder's continuation of a prompt (OpenAI's shape; stream: true)
    POST /v1/embeddings    an encoder's sentence vectors (OpenAI's shape)
    POST /v1/translate     an encoder-decoder's translations of a batch of texts
    GET  /health, /metrics requests, tokens and latency in Prometheus's text format

`app.py` (`create_app`) holds the routes, `settings.py` the limits, `batching.py`
the gathering of concurrent requests into one decode, `work.py` what a batch
does with a model, `metrics.py` the counters. Only `app.py` needs the `serve`
extra (FastAPI, uvicorn), so the rest imports without it.
"""
