"""The training loop: one `Trainer` for the three model shapes (over 400 lines: its set-up,
steps, evaluations, saves and resume share the one state of a run; what stands alone lives
beside it, in the modules named at the end).

One optimizer step (section 5):

    for each of `accumulate` micro-batches: loss_sum += objective(model, batch); backward
    g <- g * world_size / (target tokens in the global batch)     (DDP averaged over ranks)
    clip ||g|| to clip_norm;  AdamW step;  lr <- lr * schedule(step)

Dividing the summed loss by the global token count, rather than averaging
per micro-batch, makes accumulation and DDP give the gradient of one big batch.
Nothing in a step reads a number back from the device, so on a GPU the next
step is prepared while this one runs: the sums stay there until a record is
made, and a NaN or infinite loss is caught on the device, where its update
(and every later one) is skipped, and reported when the Trainer next reads
(`loss_watch.py`), so the last checkpoint stays good. It evaluates every
`eval.every` steps, saves every
`train.save_every` steps, and on Ctrl-C or SIGTERM (or when `train.max_minutes`
is spent) finishes the step, saves and returns.
Everything needed to continue bit-for-bit is saved: weights, optimizer,
scheduler, scaler, RNG states, the position in the data and the settings; a
resume under changed settings follows them.

The records it writes are measured by `attnkit.train.metrics`, a stop before
`train.steps` is decided by `attnkit.train.stopping`, the checkpoints are
written and resumed by `attnkit.train.checkpoint`, and the run folder is held
by one training at a time (`attnkit.train.lock`). How the ranks hold the model (DDP,
FSDP) is `attnkit.train.parallel`'s, with its sharded checkpoints in
`attnkit.train.distributed_checkpoint`; recomputing activations is
`attnkit.train.activation_checkpointing`'s; a model built on the meta device is sharded, then
initialised, by `attnkit.train.meta_init`; the MFU of the log is `attnkit.train.mfu`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from attnkit.checks import check
from attnkit.data.batch import Batch
from attnkit.devices import resolve_device
from attnkit.errors import AttnkitError
from attnkit.models import TransformerModel
from attnkit.models.base import unwrap
from attnkit.nn.moe import take_dropped_tokens
from attnkit.run import RunFolder
from attnkit.train import checkpoint as ckpt
from attnkit.train import distributed as dist
from attnkit.train import distributed_checkpoint, lock, loggers, meta_init, new_run
from attnkit.train.activation_checkpointing import apply_activation_checkpointing
from attnkit.train.compilation import compile_blocks, compile_mode
from attnkit.train.cross_entropy import chunked_cross_entropy
from attnkit.train.host_memory import reuse_freed_memory
from attnkit.train.loss_watch import LossWatch
from attnkit.train.metrics import Interval, Metric, validate
from attnkit.train.mfu import MFU
from attnkit.train.objectives import Objective, TrainingObjective, objective_for
from attnkit.train.optim import optimization
from attnkit.train.parallel import Parallel
from attnkit.train.precision import training_precision
from attnkit.train.run_config import EvalSection, RunConfig, TrainSection
from attnkit.train.stopping import STOP_SIGNALS, BestMetric, Stopping, TrainResult

log = logging.getLogger(__name__)


class Trainer:
    """Trains `model` on `train_data`, an iterable of `Batch` re-iterated each epoch.

    The data is this process's shard; if it (or its `batch_sampler`) has
    `set_epoch`, it is called before each epoch so shuffling differs per epoch
    but is reproducible. For an exact resume, iterating the data must not draw
    from the global RNG (give a DataLoader its own `generator`). `metrics` are
    computed on rank 0 at each evaluation (on every rank under FSDP, whose forward passes
    all take part in). Under torchrun, or alone with `train.parallel = "fsdp"`, `fit` joins
    a process group; `attnkit.train.distributed.teardown()` leaves it. Under FSDP the
    result's model is the whole model on rank 0's CPU, and the sharded one on the others.
    `resume_command` is what the log tells to run to continue a stopped run.
    """

    def __init__(
        self,
        model: TransformerModel,
        train_data: Iterable[Batch],
        *,
        train: TrainSection | None = None,
        eval: EvalSection | None = None,
        objective: TrainingObjective | None = None,
        val_data: Iterable[Batch] | None = None,
        metrics: Sequence[Metric] = (),
        run_dir: str | Path | None = None,
        tokenizer: Any = None,
        run_config: RunConfig | None = None,
        callbacks: Sequence[Callable[[dict[str, Any]], None]] = (),
        resume_command: str = "Trainer.fit(resume=True)",
    ) -> None:
        self.train_cfg = train or TrainSection()
        self.eval_cfg = eval or EvalSection()
        self.model = model
        self.objective = objective or objective_for(
            model.config.shape,
            self.train_cfg.label_smoothing,
            vocab_size=model.config.vocab_size,
            copy=model.config.copy_attention != "none",
        )
        c = self.train_cfg
        if c.cross_entropy == "chunked":  # the head's loss, by chunks of positions
            check(
                isinstance(self.objective, Objective),
                f"train.cross_entropy 'chunked' needs a loss over the model's head, and "
                f"{type(self.objective).__name__}'s is not one; use 'fused'",
            )
            chunks = c.cross_entropy_chunks
            self.objective.use_head_loss(functools.partial(chunked_cross_entropy, chunks=chunks))
        self.train_data, self.val_data = train_data, val_data
        self.metrics, self.callbacks = list(metrics), list(callbacks)
        self.run_dir = Path(run_dir if run_dir is not None else self.train_cfg.out_dir)
        self.folder = RunFolder(self.run_dir)
        self.tokenizer, self.run_config = tokenizer, run_config
        self.step = self.epoch = self.position = 0
        self.saved_step: int | None = None  # of the last checkpoint in the run folder
        e = self.eval_cfg
        self.best = BestMetric(e.lower_is_better, e.patience)  # eval.metric's, for patience
        self.history: list[dict[str, Any]] = []
        self.length = 0  # of the last batch's sequences, for the MFU's attention term
        self.stopping = Stopping(c.max_minutes, resume_command)
        self.precision = training_precision(c.precision, resolve_device(c.device))

    # -- public ---------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current step, save a checkpoint and return from `fit` (what Ctrl-C does)."""
        self.stopping.requested = True

    def fit(self, resume: bool = False) -> TrainResult:
        """Train to `train.steps` (from the saved state with `resume`); returns how it ended.

        The run folder is locked meanwhile: a second training of it refuses.
        """
        c = self.train_cfg
        if c.threads:
            torch.set_num_threads(c.threads)
        device_type = "cuda" if resolve_device(c.device).type == "cuda" else "cpu"
        self.dist = dist.setup(
            device_type, alone=c.parallel == "fsdp", timeout=c.rendezvous_timeout
        )
        if (self.dist.active or c.parallel == "fsdp") and not self.objective.one_forward:
            raise AttnkitError(
                f"this run's objective ({type(self.objective).__name__}) backpropagates through "
                "more than one forward pass per step, which DDP and FSDP cannot synchronise; "
                "train it in one process with train.parallel 'ddp'"
            )
        self.device = resolve_device(c.device, self.dist.local_rank)
        self.parallel = Parallel(c, self.dist, self.device, self.precision)
        check = None if resume else lambda: new_run.check_new_run(self.folder)
        with lock.hold(self.folder, is_main=self.dist.is_main, check=check):
            self._prepare(resume)
            sinks = loggers.open_for(self._log_context())
            with self.stopping.on_signals(lambda: self.step), sinks as self.sinks:
                stopped = self._loop()
            self._finish(stopped)
        whole = self.parallel.consolidated(self.model)
        model = self.model if whole is None else whole
        return TrainResult(
            model.eval(), self.step, stopped, self.run_dir, self.history, self.best.best
        )

    def evaluate(self) -> dict[str, float]:
        """Validation loss and perplexity over `val_data`, plus the extra metrics."""
        with self.parallel.gathered(self.model):
            return validate(
                self.model,
                self.objective,
                self.val_data,
                self.metrics,
                device=self.device,
                seed=self.train_cfg.seed,
                max_batches=self.eval_cfg.max_batches,
                autocast=self._autocast,
                # FSDP's forward passes are collectives: every rank decodes, rank 0's counts.
                is_main=self.dist.is_main or self.parallel.sharded,
            )

    # -- setup ----------------------------------------------------------------------------------

    def _prepare(self, resume: bool) -> None:
        """The optimizer, schedule and scaler, a new run's folder or the saved state, and the
        model that runs forward (checkpointed, sharded or DDP, compiled)."""
        c = self.train_cfg
        if self.dist.is_main and (cut := ckpt.remove_cut_writes(self.folder)):
            log.info("removed %d temporary files of saves cut short in %s", cut, self.run_dir)
        if self.device.type == "cpu" and c.reuse_freed_memory:
            reuse_freed_memory()
        on_meta = meta_init.is_on_meta(self.model)  # weights without memory until sharded
        if not on_meta:
            self.model.to(self.device)
        apply_activation_checkpointing(self.model, c.activation_checkpointing)
        self.parallel.shard(self.model)  # before the optimizer, which then updates the shards
        if on_meta:  # this rank's slices, drawn as a normal build draws them
            torch.manual_seed(c.seed)
            meta_init.materialize(self.model, self.device)
        torch.manual_seed(c.seed + self.dist.rank)
        one_shape = getattr(getattr(self.train_data, "dataset", None), "one_shape", False)
        alone = not (self.dist.active or self.parallel.sharded)
        mode = compile_mode(c.compile_mode, self.device, one_shape=one_shape, alone=alone)
        if c.compile and c.compile_scope == "block":  # in place: FSDP's units, names kept
            compile_blocks(self.model, mode)
        self.optimizer, self.scheduler, self.budget = optimization(self.model, c)
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=self.precision == "fp16" and self.device.type == "cuda"
        )
        if resume:
            self._resume()
        else:
            self._start()
        forward = self.parallel.wrap(self.model)
        self.cuda_graphs = c.compile and mode == "reduce-overhead"
        if c.compile and c.compile_scope == "model":
            forward = torch.compile(forward, mode=mode)
        self.forward_model = forward
        self.mfu = MFU(self.model, self.device, self.dist.world_size, c.peak_tflops)

    def _start(self) -> None:
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.folder.write_metrics()
            self._record_run_config()
            if self.tokenizer is not None:
                self.tokenizer.save(self.folder.tokenizer)

    def _resume(self) -> None:
        info, sharded = self.dist, self.parallel.sharded
        state = ckpt.resume(self.folder, self.model, info.rank, info.world_size, not sharded)
        steps = self.train_cfg.steps
        if state["step"] > steps:  # else it would say "finished" and record `steps` as its length
            raise AttnkitError(
                f"{self.run_dir} stopped at step {state['step']:,}, past train.steps {steps:,}, "
                "so resuming would train nothing; give train.steps above "
                f"{state['step']:,} to train on (--set train.steps=N), or use the run as it is"
            )
        self.model.to(self.device)
        now = ckpt.settings(self.train_cfg, self.eval_cfg)
        changes = ckpt.changed_settings(state, now, self.run_dir)
        data_changes = self._data_changes()  # before the run config is recorded anew
        ckpt.restore_optimization(
            state,
            self.optimizer,
            self.scheduler,
            self.scaler,
            changed=bool(changes),
            load_optimizer=lambda: distributed_checkpoint.restore(
                self.folder, state, self.model, self.optimizer
            ),
        )
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.saved_step = self.step
        if "eval.metric" not in changes:  # else the best so far was by another metric
            self.best.best, self.best.bad_evals = state["best"], state["bad_evals"]
        if self.dist.is_main:
            # Records written after the checkpoint belong to steps that will run again.
            self.history = [r for r in self.folder.read_metrics() if r["step"] <= self.step]
            self.folder.write_metrics(self.history)
            self._record_run_config()  # the settings the run goes on with
        changes = {**changes, **data_changes}
        changed = f" with changed settings: {ckpt.describe(changes)}" if changes else ""
        log.info("resumed %s at step %d%s", self.run_dir, self.step, changed)

    def _log_context(self) -> loggers.LogContext:
        """What the sinks of `train.log_to` are told of this session."""
        c, e = self.train_cfg, self.eval_cfg
        run = self.run_config
        hparams = run.to_dict() if run else {"train": asdict(c), "eval": asdict(e)}
        hparams["model"] = {**hparams.get("model", {}), **self.model.config.to_dict()}
        name = c.log_name or self.run_dir.resolve().name
        examples = self.val_data if self.val_data is not None else self.train_data
        return loggers.LogContext(
            self.folder, c.log_to, c.log_project, name, hparams, e.metric, self.step,
            self.model, self.tokenizer, examples, self.dist.is_main,
        )  # fmt: skip

    def _data_changes(self) -> dict[str, tuple[Any, Any]]:
        """The [data] keys that differ from the run config the run was saved with: the corpus
        and its batches are read anew, so they apply, and are listed with the other changes."""
        if self.run_config is None:
            return {}
        then = self.folder.data_defaults()
        now = asdict(self.run_config.data)
        return {f"data.{k}": (v, now[k]) for k, v in then.items() if k in now and v != now[k]}

    def _record_run_config(self) -> None:
        if self.run_config is not None:
            self.folder.write_run_config(self.run_config.to_toml())

    # -- the loop -------------------------------------------------------------------------------

    def _batches(self) -> Iterator[Batch]:
        """Batches forever, epoch after epoch, starting at the saved data position."""
        while True:
            # The loader's sampler orders batches, its dataset may place windows, per epoch.
            data = self.train_data
            for target in (
                data,
                getattr(data, "batch_sampler", None),
                getattr(data, "dataset", None),
            ):
                if hasattr(target, "set_epoch"):
                    target.set_epoch(self.epoch)
            seen = 0
            for i, batch in enumerate(self.train_data):
                seen += 1
                if i < self.position:
                    continue
                self.position = i + 1
                yield batch
            if seen == 0:
                raise AttnkitError(
                    "the training data yields no batches; check the data files, the split and "
                    "that one example fits in data.max_tokens"
                )
            self.epoch, self.position = self.epoch + 1, 0

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def _loop(self) -> str:
        c = self.train_cfg
        batches = self._batches()
        self.model.train()
        self.stopping.begin()
        if self.budget is not None:
            self.budget.begin(self.step)
        interval = Interval(self.device)
        # Reading the loss waits for the device: on a GPU only every log_every steps, where the
        # fused AdamW can skip a bad step's update on the device meanwhile.
        fused = all(group.get("fused") for group in self.optimizer.param_groups)
        lazy = fused and self.device.type != "cpu"
        self.watch = LossWatch(self.device, c.log_every if lazy else 1)
        while self.step < c.steps:
            self.objective.start_step(self.step)
            # One all-reduce gives every rank the global sums (NCCL wants them on the device).
            sums = dist.all_reduce_sum(self._accumulate(batches))
            trained = sums[0] + sums[2] + sums[3]  # loss, auxiliary and sequence-level sums
            skip = self.watch.step(self.step + 1, trained, sums[1])
            self._update(sums[1], skip)
            self.step += 1
            interval.add(sums)
            if self.watch.due(self.step):
                self.watch.check(self.run_dir, self.saved_step)
            info = {"step": self.step, "steps": c.steps, "lr": self.scheduler.get_last_lr()[0]}
            if self.step % c.log_every == 0 or self.step == c.steps:
                info |= self._log(interval)
            for callback in self.callbacks:
                callback(info)
            stopped = self.stopping.after(self.step, self.device, early=self._maybe_evaluate())
            if stopped and interval.steps:
                self._log(interval)  # the curves end where the run ends
            if self.budget is not None:
                self.budget.observe(self.step, self.stopping.seconds)
            # The next step's rate, once this step's time is known (a time budget's pace); a
            # checkpoint holds it, so a resumed run goes on at that rate.
            self.scheduler.step()
            if stopped or self.step % c.save_every == 0 or self.step == c.steps:
                self._save()
            if stopped:
                return stopped
        return "finished"

    def _accumulate(self, batches: Iterator[Batch]) -> torch.Tensor:
        """Forward and backward over `accumulate` micro-batches; the sums of `LossTerms.recorded`:
        loss, tokens, auxiliary loss, sequence-level loss, reward and sources."""
        n = self.train_cfg.accumulate
        sums = torch.zeros(6, dtype=torch.float64, device=self.device)
        for i in range(n):
            batch = next(batches).to(self.device, non_blocking=True)
            # The positions a token attends over: a target reads all but its last token.
            self.length = batch.tgt.shape[1] - 1 if batch.tgt is not None else batch.src.shape[1]
            self.mfu.add(batch)  # an encoder-decoder's FLOPs depend on both sides' lengths
            # DDP all-reduces on every backward unless told to wait for the last micro-batch;
            # FSDP reduce-scatters each, which keeps the gradients sharded.
            sync = i == n - 1 or not self.dist.active or self.parallel.sharded
            ctx = contextlib.nullcontext() if sync else self.forward_model.no_sync()
            if self.cuda_graphs:  # the last step's graph outputs are no longer read
                torch.compiler.cudagraph_mark_step_begin()
            with ctx:
                with self._autocast():
                    terms = self.objective(self.forward_model, batch)
                self.scaler.scale(terms.total).backward()
            sums += terms.recorded()
        return sums

    def _update(self, global_tokens: torch.Tensor, skip: torch.Tensor) -> None:
        """Scale, clip and apply the gradients; `skip` (1.0 on the device) leaves the weights as
        they are, as the fused AdamW does for GradScaler's `found_inf`."""
        self.scaler.unscale_(self.optimizer)
        # DDP averaged the per-rank sums; this turns them into the mean over the global batch.
        scale = (self.dist.world_size / global_tokens.clamp_min(1)).float()
        params = [p for p in self.model.parameters() if p.grad is not None]
        torch._foreach_mul_([p.grad for p in params], scale)
        if (clip := self.train_cfg.clip_norm) > 0:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        if self.watch.every > 1 and not self.scaler.is_enabled():  # GradScaler sets its own
            self.optimizer.found_inf = skip
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def _log(self, interval: Interval) -> dict[str, Any]:
        record = interval.close(self.step, self.train_cfg.steps, self.scheduler.get_last_lr()[0])
        dropped = take_dropped_tokens(unwrap(self.model))
        if dropped is not None:  # tokens a switch router had no room for, since the last record
            record["dropped_tokens"] = dropped
        if (mfu := self.mfu.of(record["tokens_per_s"], self.length)) is not None:
            record["mfu"] = mfu
            log.info("step %d  MFU %.1f%%", self.step, 100 * mfu)
        self._record(record)
        return {"loss": record["train_loss"], "tokens_per_s": record["tokens_per_s"]}

    def _maybe_evaluate(self) -> str | None:
        """Evaluate when due and track the best metric; 'early-stopped' when patience runs out."""
        e = self.eval_cfg
        due = self.step % e.every == 0 or self.step == self.train_cfg.steps
        if not due or (self.val_data is None and not self.metrics):
            return None
        self.watch.check(self.run_dir, self.saved_step)
        result = self.evaluate()
        self._record({"step": self.step, "minutes": round(self.stopping.minutes, 2), **result})
        self.sinks.evaluated(self.step, self.history)
        if e.metric not in result:
            raise AttnkitError(
                f"eval.metric {e.metric!r} is not computed by this run; choose one of "
                f"{', '.join(result)}"
            )
        log.info("step %d  %s", self.step, "  ".join(f"{k} {v:.4g}" for k, v in result.items()))
        if self.best.update(result[e.metric]):
            whole = self.parallel.consolidated(self.model)  # FSDP: every rank gathers
            if self.dist.is_main:
                ckpt.save_best(self.folder, whole)
        if self.best.exhausted:
            log.info("early stop: no better %s in %d evaluations", e.metric, e.patience)
            return "early-stopped"
        return None

    def _record(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.dist.is_main:
            self.folder.append_metrics(record)
            self.sinks.record(record)  # TensorBoard, W&B (train.log_to)

    def _save(self) -> None:
        self.watch.check(self.run_dir, self.saved_step)  # a checkpoint is never of a bad step
        rngs = dist.gather_objects(ckpt.rng_state())
        whole, sharded = self.parallel.consolidated(self.model), self.parallel.sharded
        if sharded:  # every rank writes its slices, before rank 0 names the step
            distributed_checkpoint.save_shards(self.folder, self.step, self.model, self.optimizer)
        if self.dist.is_main:
            state = {
                "step": self.step,
                "epoch": self.epoch,
                "position": self.position,
                "optimizer": None if sharded else self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rngs,
                "best": self.best.best,
                "bad_evals": self.best.bad_evals,
                "model_config": self.model.config.to_dict(),
                "world_size": self.dist.world_size,
                "settings": ckpt.settings(self.train_cfg, self.eval_cfg),
            }
            ckpt.save_checkpoint(self.folder, whole, state, self.train_cfg.keep_last)
            log.debug("saved step %d to %s", self.step, self.run_dir)
        self.saved_step = self.step

    def _finish(self, stopped: str) -> None:
        n = self.train_cfg.average_last
        if self.dist.is_main and stopped not in STOP_SIGNALS.values():
            if n > 1:
                steps = ckpt.average_last(self.folder, n)
                log.info("model.safetensors is the mean of the checkpoints of steps %s", steps)
            if self.history:
                from attnkit.viz import plot_curves

                plot_curves(self.history, self.folder.curves)
