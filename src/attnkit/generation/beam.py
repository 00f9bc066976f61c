"""Batched beam search, with Hugging Face's candidate selection, scoring and stopping rules.

    keep the num_beams best prefixes by  sum_t log p(y_t | y_<t, x)
    a finished hypothesis scores         sum_t log p(y_t | y_<t, x) / length^length_penalty

All sentences of a batch search at once on the model's KV cache, which is
reordered by beam at every step; a sentence leaves the batch once no running
beam can beat its finished hypotheses (on a static cache its rows stay,
decoding on unread, so that every step has the same shapes).

A search is resumable (`BeamSearch`): it keeps its decoding state between
calls and runs a few steps a call (`advance`), so a thread that also decodes
other requests (the batching engine's) gives way between two slices of a long
search rather than waiting for its end: the server's work (`serve/work.py`)
advances it between two jobs of its own, and `sliced` runs one on an executor
(the engine's `Scheduler`) a slice a job. A search run in slices gives the
same hypotheses and scores as one run whole (`beam_search`): slicing only
decides when the steps run, never what they compute.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future, InvalidStateError

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.checks import check, positive_int
from attnkit.generation.config import GenerateOutput, GenerationConfig, on_ids, resolve
from attnkit.generation.processors import needs_history, process
from attnkit.generation.state import evaluating, prefill
from attnkit.models import TransformerModel

# Added to a score to rule a candidate out while keeping arithmetic finite, as HF does.
_EXCLUDED = -1.0e9


@torch.no_grad()
def beam_search(
    model: TransformerModel,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    **options,
) -> GenerateOutput:
    """Batched beam search with HF's candidate selection, scoring and stopping rules.

    `generate` calls it when num_beams > 1; called directly it also runs with one beam.
    """
    search = BeamSearch(model, input_ids, attention_mask, config, **options)
    search.advance(max(1, search.max_new))  # all its steps (none left: it has ended)
    return search.result()


def sliced(executor: Executor, search: Callable[[], BeamSearch], steps: int) -> Future:
    """Run a beam search on `executor` a slice at a time: `search()` (which runs the prefix)
    in one job, then `steps` steps a job, each job submitting the next, so that the
    executor's other work (the batching engine's decoding steps) goes on between two slices.
    The Future gives what `result()` gives; cancelled, the search stops before its next
    slice and gives its cache back, as it does when the executor drops a slice it had
    queued (shut down): then the Future is cancelled, so its caller hears it."""
    positive_int("steps", steps)
    future: Future = Future()
    held: list[BeamSearch] = []

    def dropped(job: Future) -> None:
        if job.cancelled():
            if held:
                held[0].close()
            future.cancel()

    def next_slice() -> None:
        executor.submit(run_slice).add_done_callback(dropped)

    def run_slice() -> None:
        try:
            if future.cancelled():
                ended = True
            elif not held:
                held.append(search())
                ended = held[0].done
            else:
                ended = held[0].advance(steps)
            if not ended:
                next_slice()
                return
            if not future.cancelled():
                future.set_result(held[0].result())
        except InvalidStateError:  # cancelled while its last slice ran
            pass
        except BaseException as error:  # the caller hears it
            if not future.done():
                future.set_exception(error)
        if held:
            held[0].close()

    next_slice()
    return future


class BeamSearch:
    """A batched beam search run a slice at a time: the prefix runs once when it is made,
    then each `advance(n)` runs up to n decoding steps, until it returns True (ended);
    `result()` is then what `beam_search` returns. `close()` frees its cache early (a
    search abandoned half-way); an ended search has freed it.

    Between calls it holds the running beams (`run_seq`, `run_score`: sentences x beams),
    the finished hypotheses (`fin_*`), the sentences still searched (`active`) and the
    logits the next step reads, beside the decoding state's cache.
    """

    @torch.no_grad()
    def __init__(
        self,
        model: TransformerModel,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        config: GenerationConfig | None = None,
        **options,
    ) -> None:
        self.model = model
        cfg = self.cfg = on_ids(resolve(config, options, model.config))
        with evaluating(model):
            self.state, prefix, prefix_mask, self.max_new = prefill(
                model, input_ids, attention_mask, cfg
            )
        self.n_sent, self.start = prefix.shape
        k, device = cfg.num_beams, prefix.device
        self.total = total = self.start + self.max_new
        self.n_keep = max(2, 1 + len(cfg.eos_ids)) * k
        self.top_k_mask = torch.arange(self.n_keep, device=device) < k
        self.eos = torch.tensor(cfg.eos_ids, dtype=torch.long, device=device)

        # Running beams of the sentences still searched; finished hypotheses of all sentences.
        shape = (self.n_sent, k)
        self.run_seq = torch.full(
            (*shape, total), cfg.pad_token_id, dtype=torch.long, device=device
        )
        self.run_seq[:, :, : self.start] = prefix[:, None]
        self.run_score = torch.zeros(shape, device=device)
        self.run_score[:, 1:] = _EXCLUDED  # beams start equal: only the first expands at step 0
        self.fin_seq = self.run_seq.clone()
        self.fin_score = torch.full(shape, _EXCLUDED, device=device)
        self.fin_done = torch.zeros(shape, dtype=torch.bool, device=device)
        self.fin_len = torch.zeros(shape, dtype=torch.long, device=device)
        # Beams of a sentence share its prompt, so `real` (rows sentence * k + beam) never reorders.
        self.real = None
        if needs_history(cfg):
            self.real = torch.ones(self.n_sent * k, total, dtype=torch.bool, device=device)
            if prefix_mask is not None:
                self.real[:, : self.start] = prefix_mask.repeat_interleave(k, 0)

        # The prefix ran once per sentence; its beams share it.
        self.logits = self.state.logits.repeat_interleave(k, 0)
        self.state.repeat_rows(k)
        self.active = torch.arange(self.n_sent, device=device)
        self.step = 0  # decoding steps run
        self.done = self.max_new <= 0
        if self.done:
            self.close()

    @torch.no_grad()
    def advance(self, steps: int) -> bool:
        """Run up to `steps` more decoding steps; True once the search has ended."""
        positive_int("steps", steps)
        if self.done:
            return True
        check(self.state is not None, "this beam search was closed before its end; start anew")
        try:
            with evaluating(self.model):
                for _ in range(steps):
                    self.done = self._step()
                    if self.done:
                        break
        except BaseException:
            self.close()
            raise
        if self.done:
            self.close()
        elif self.state.static:
            # a CUDA graph's outputs are rewritten by its next replay, which another decoding
            # of this shape may run before this search's next slice
            self.logits = self.logits.clone()
        return self.done

    def close(self) -> None:
        """Give the decoding state's cache back (a static cache's buffers go to the next
        decoding of their shape); the hypotheses found so far stay."""
        if self.state is not None:
            self.state.close()
            self.state = None

    def result(self) -> GenerateOutput:
        """The best num_return_sequences hypotheses of each sentence and their scores."""
        check(self.done, f"the beam search has run {self.step} steps and not ended; advance it")
        n_ret = self.cfg.num_return_sequences
        length = self.start + int(self.fin_len[:, :n_ret].max())
        return GenerateOutput(
            self.fin_seq[:, :n_ret, :length].flatten(0, 1),
            self.fin_score[:, :n_ret].flatten(),
            self.start,
            self.cfg.eos_ids,
        )

    def _step(self) -> bool:
        """One decoding step: choose the beams that go on and the hypotheses that finish,
        then feed the beams' tokens; True when the search ends at this step."""
        cfg, k, state, active = self.cfg, self.cfg.num_beams, self.state, self.active
        step, start, total, max_new = self.step, self.start, self.total, self.max_new
        lp, early = cfg.length_penalty, cfg.early_stopping
        device = self.run_seq.device
        cur, a = start + step, len(active)
        self.step += 1
        log_probs = F.log_softmax(self.logits.float(), dim=-1)
        if self.real is not None:
            rows = (active[:, None] * k + torch.arange(k, device=device)).flatten()
            seqs = self.run_seq[active].flatten(0, 1)[:, :cur]
            log_probs = process(log_probs, seqs, self.real[rows, :cur], step, max_new, cfg)
        else:
            log_probs = process(log_probs, None, None, step, max_new, cfg)
        vocab = log_probs.shape[-1]
        scores = log_probs.view(a, k, vocab) + self.run_score[active][:, :, None]
        scores = scores.view(a, k * vocab)
        cand_score, cand = scores.topk(self.n_keep, dim=1)
        parent, token = cand // vocab, cand % vocab
        seq_a = self.run_seq[active]
        cand_seq = seq_a.gather(1, parent[:, :, None].expand(-1, -1, total))
        cand_seq[:, :, cur] = token
        hits = torch.isin(token, self.eos) | (cur + 1 >= total)

        # Beams that go on: the best k candidates that did not just finish.
        go_score = cand_score + hits.float() * _EXCLUDED
        go = go_score.topk(k, dim=1).indices
        new_run_seq = cand_seq.gather(1, go[:, :, None].expand(-1, -1, total))
        new_run_score = go_score.gather(1, go)
        new_parent = parent.gather(1, go)

        # Hypotheses that finish now: only among the best k candidates, length-penalised.
        just = hits & self.top_k_mask
        length = cur + 1 - start
        scored = cand_score / (length**lp) + (~just).float() * _EXCLUDED
        fin_score, fin_seq, fin_done, fin_len = (
            self.fin_score,
            self.fin_seq,
            self.fin_done,
            self.fin_len,
        )
        merged_score = torch.cat([fin_score[active], scored], dim=1)
        best = merged_score.topk(k, dim=1).indices
        fin_score[active] = merged_score.gather(1, best)
        merged_seq = torch.cat([fin_seq[active], cand_seq], dim=1)
        fin_seq[active] = merged_seq.gather(1, best[:, :, None].expand(-1, -1, total))
        fin_done[active] = torch.cat([fin_done[active], just], dim=1).gather(1, best)
        new_len = torch.full_like(cand, length)
        fin_len[active] = torch.cat([fin_len[active], new_len], dim=1).gather(1, best)
        self.run_seq[active], self.run_score[active] = new_run_seq, new_run_score

        # A sentence is done when no running beam can beat its worst finished hypothesis
        # (HF's heuristic), or, with early_stopping=True, once it has k of them.
        best_length = total - start if early == "never" and lp > 0 else cur + 1 - start
        best_running = new_run_score[:, :1] / (best_length**lp)
        done_a = fin_done[active]
        worst = torch.where(done_a, fin_score[active].min(1, keepdim=True).values, _EXCLUDED)
        open_ = (best_running > worst).any(-1) & ~(done_a.all(-1) & (early is True))
        if step == max_new - 1 or not bool(open_.any()) or bool(hits.all()):
            return True
        keep = open_.nonzero().flatten()
        if state.static:
            # Rows never leave a static cache: a finished sentence's beams decode on, unread.
            rows = torch.arange(self.n_sent * k, device=device).view(self.n_sent, k)
            rows[active] = active[:, None] * k + new_parent
            self.active = active[keep]
            state.reorder(rows.flatten(), memory=False)
            logits = state.step(self.run_seq[:, :, cur].flatten()[:, None])
            self.logits = logits.view(self.n_sent, k, -1)[self.active].flatten(0, 1)
            return False
        dropping = len(keep) < a
        rows = (keep[:, None] * k + new_parent[keep]).flatten()
        self.active = active[keep]
        state.reorder(rows, memory=dropping)
        self.logits = state.step(self.run_seq[self.active][:, :, cur].flatten()[:, None])
        return False
