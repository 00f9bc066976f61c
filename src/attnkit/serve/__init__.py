"""`attnkit serve`: run folders behind an HTTP API that OpenAI's clients speak.

    GET  /v1/models, /v1/models/{id}   the runs served, by name
    POST /v1/completions        a decoder's continuation of a prompt (stream: true streams)
    POST /v1/chat/completions   a decoder's answer to a conversation, through a chat template
    POST /v1/embeddings         an encoder's sentence vectors, pooled as the model says
    POST /v1/translate          an encoder-decoder's translations of a batch of texts
    POST /v1/attention          every attention weight of one text and its output, for the page
    GET  /health, /ready        alive; able to decode
    GET  /metrics               Prometheus: requests, latency and time-to-first-token
                                histograms, queue, tokens a second
    GET  /                      the page: run a model, watch it stream, look at its attention

The modules, top down: `app.py` assembles the app; `routes.py` (OpenAI's routes and
operations) and `translate.py` (attnkit's) are the routers; `protocol.py` the request
bodies (OpenAI's names mapped onto `GenerationConfig`'s), `answers.py` the answers'
shapes, `errors.py` the errors', `guard.py` the limits, key and access log; `server.py`
the state the routes share; `runs.py` the models served (`served_runs`) and where
request text enters a model; `chat.py` chat templates; `outputs.py` a request's outputs
on the decoding engine; `batching.py` and `work.py` the batched work beside decoding
(sentence vectors, beam search, attention views); `metrics.py`; `page.py` the page.
Decoding itself is `attnkit.generation`'s: iteration-level batching
(`generation/batching.py`) of rows (`generation/rows.py`), each token chosen by its
row's own `GenerationConfig` (`generation/chooser.py`), the one engine that `attnkit.LLM`
runs too. Everything but `settings` needs the `serve` extra.
"""
