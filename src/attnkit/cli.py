"""The command line: `attnkit demo | train | translate | generate | eval | import | export`.

Only wiring lives here: each command parses its options, calls the library,
and shows progress and results. Bad input from anywhere below arrives as an
`AttnkitError` and is printed as its one sentence, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
import time
from pathlib import Path

from attnkit.errors import AttnkitError

log = logging.getLogger("attnkit")


class _Progress:
    """A tqdm bar fed by the Trainer's per-step callback: loss, learning rate, tokens/s, ETA."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)
        self.tokens, self.last = 0.0, time.perf_counter()

    def __call__(self, info: dict) -> None:
        if self.bar.n == 0 and info["step"] > 1:
            self.bar.update(info["step"] - 1)  # a resumed run starts part-way
        self.bar.update(1)
        self.tokens += info["tokens"]
        if info["step"] % 10 == 0:
            now = time.perf_counter()
            rate = self.tokens / max(now - self.last, 1e-9)
            self.bar.set_postfix(
                loss=f"{info['loss']:.4f}", lr=f"{info['lr']:.2e}", tok_s=f"{rate:.0f}"
            )
            self.tokens, self.last = 0.0, now

    def redirect_logging(self) -> contextlib.AbstractContextManager:
        """Log lines printed above the bar instead of through it."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm()

    def close(self) -> None:
        self.bar.close()


def cmd_demo(args: argparse.Namespace) -> int:
    """Train the digit-reversal model, print held-out examples, draw its attention."""
    import shutil

    from attnkit import demo
    from attnkit.train.checkpoint import STATE_FILE

    c = demo.demo_config()
    print(
        f"attnkit demo: teach a {c.n_encoder_layers}+{c.n_decoder_layers}-layer Transformer "
        f"(d_model {c.d_model}) to reverse digit strings"
    )
    out = Path(args.out)
    run_dir = out / "run"
    if (run_dir / STATE_FILE).exists():  # the demo starts afresh each time
        shutil.rmtree(run_dir)
    overrides = {"train.steps": args.steps, "train.seed": args.seed, "train.out_dir": str(run_dir)}
    if args.threads:
        overrides["train.threads"] = args.threads
    config = demo.demo_run_config(**overrides)
    if not args.verbose:
        logging.getLogger("attnkit.train").setLevel(logging.WARNING)  # the bar says enough
    start = time.perf_counter()
    progress = _Progress(args.steps, "training")
    try:
        with progress.redirect_logging():
            model = demo.train_reverser(config, callbacks=[progress]).model
    finally:
        progress.close()
    train_time = time.perf_counter() - start
    task = demo.ReverseTask(max_len=config.data.max_len)
    accuracy, results = demo.exact_match(model, task, args.eval_examples, seed=args.seed + 1)
    print(f"\n{'source':>14}  {'expected':>14}  {'model':>14}")
    for src, tgt, hyp in results[:8]:
        mark = "ok" if tgt == hyp else "WRONG"
        print(f"{demo.show(src):>14}  {demo.show(tgt):>14}  {demo.show(hyp):>14}  {mark}")
    print(
        f"\nexact match on {args.eval_examples} held-out strings: {accuracy:.1%} "
        f"(trained {args.steps} steps in {train_time:.0f} s)"
    )
    picture = demo.attention_picture(model, results[0][0], out / "attention.png")
    print(f"cross-attention heat map: {picture}")
    print(f"run folder (model, metrics, curves): {run_dir}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train the model a run config describes; the run folder is its train.out_dir."""
    from attnkit.train import distributed as dist
    from attnkit.train.run_config import RunConfig
    from attnkit.train.tasks import train

    config = RunConfig.load(args.config, args.set or [])
    info = dist.from_env()
    if not info.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # only rank 0 talks
    progress = _Progress(config.train.steps, "training") if info.is_main else None
    try:
        with progress.redirect_logging() if progress else contextlib.nullcontext():
            result = train(config, resume=args.resume, callbacks=[progress] if progress else [])
    finally:
        if progress:
            progress.close()
        dist.teardown()
    if not info.is_main:
        return 0
    if result.stopped == "interrupted":
        print(
            f"stopped at step {result.step} and saved; continue with: "
            f"attnkit train {args.config} --resume"
        )
        return 130
    best = f", best {config.eval.metric} {result.best:.4g}" if result.best is not None else ""
    print(f"{result.stopped} at step {result.step}{best}; run folder: {result.run_dir}")
    return 0


def _load_run(args: argparse.Namespace):
    """The model and tokenizer of RUN_DIR, on the asked device, with the asked threads."""
    import torch

    from attnkit.run import load_pretrained
    from attnkit.tokenizer import Tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    model = load_pretrained(run_dir, device=args.device)
    if not (run_dir / "tokenizer.json").is_file():
        raise AttnkitError(
            f"{run_dir} has no tokenizer.json; train the run with a tokenizer or copy one there"
        )
    return model, Tokenizer.load(run_dir / "tokenizer.json")


def _generation_config(args: argparse.Namespace, model):
    """GenerationConfig from the decoding options common to translate, generate and eval."""
    from attnkit.generate import GenerationConfig

    options = {
        "max_new_tokens": args.max_new_tokens or model.config.max_len - 1,
        "num_beams": getattr(args, "beam", 1),
        "length_penalty": getattr(args, "length_penalty", 1.0),
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "repetition_penalty": args.repetition_penalty,
    }
    if getattr(args, "sample", False):
        options.update(
            do_sample=True,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
        )
    return GenerationConfig(**options)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="line",
        disable=not enabled or total < 64,
        dynamic_ncols=True,
        file=sys.stderr,
    )


def cmd_translate(args: argparse.Namespace) -> int:
    """Translate lines from --input (or stdin), one output line per input line, in order."""
    from attnkit.inference import translate

    model, tokenizer = _load_run(args)
    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise AttnkitError(f"no input file at {path}")
        lines = path.read_text(encoding="utf-8").splitlines()
    else:
        lines = sys.stdin.read().splitlines()
    if _run_data_defaults(Path(args.run_dir)).get("lowercase"):
        lines = [line.lower() for line in lines]  # the model was trained on lowercased text
    config = _generation_config(args, model)
    with _progress(len(lines), "translating", not args.no_progress) as bar:
        outputs = translate(
            model,
            tokenizer,
            lines,
            config,
            batch_size=args.batch_size,
            refuse_long=args.refuse_long,
            progress=bar.update,
        )
    text = "".join(f"{line}\n" for line in outputs)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    if args.attention_plot and lines:
        picture = _attention_plot(model, tokenizer, lines[0], outputs[0], args.attention_plot)
        print(f"cross-attention of the first input: {picture}", file=sys.stderr)
    return 0


def _attention_plot(model, tokenizer, source: str, translation: str, path: str) -> Path:
    """Cross-attention of one source and its output: each decoder layer (mean of its heads),
    then each head of the last layer."""
    import torch

    from attnkit.viz import plot_attention

    src = tokenizer.encode(source, add_eos=True)[: model.config.max_len]
    tgt = tokenizer.encode(translation, add_bos=True)[: model.config.max_len]
    with torch.no_grad():
        out = model(torch.tensor([src]), torch.tensor([tgt]), need_weights=True)
    cross = out.attentions["cross"]
    layers = [w[0].mean(0) for w in cross]
    heads = list(cross[-1][0])
    pieces = tokenizer.id_to_token
    return plot_attention(
        [layers, heads],
        path,
        queries=[pieces(i) or "?" for i in tgt],
        keys=[pieces(i) or "?" for i in src],
        titles=[f"layer {i + 1}, mean of heads" for i in range(len(layers))]
        + [f"layer {len(cross)}, head {h + 1}" for h in range(len(heads))],
        suptitle="cross-attention",
    )


def cmd_generate(args: argparse.Namespace) -> int:
    """Continue --prompt with a language model, streaming the text as it is produced."""
    from attnkit.inference import complete

    model, tokenizer = _load_run(args)
    config = _generation_config(args, model)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    for piece in complete(model, tokenizer, args.prompt, config):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _run_data_defaults(run_dir: Path) -> dict:
    """The [data] section of the run's saved training config, if the trainer left one."""
    import tomllib

    path = run_dir / "run_config.toml"
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text()).get("data", {})
    except tomllib.TOMLDecodeError as err:
        raise AttnkitError(f"{path} is not valid TOML ({err}); fix or remove it") from None


def _split_name(corpus: str, split: str | None) -> str:
    """A split by its name or an unambiguous prefix (`test` is Multi30k's `test_2016_flickr`).

    None picks the corpus's test split, or its validation split when it has no test split
    (Tiny Shakespeare is cut into train and val only).
    """
    from attnkit.data import CORPORA

    known = CORPORA[corpus].splits if corpus in CORPORA else ()
    if split is None:
        split = "val" if known and not any(s.startswith("test") for s in known) else "test"
    if corpus not in CORPORA or split in known:
        return split
    matches = [s for s in CORPORA[corpus].splits if s.startswith(split)]
    return matches[0] if len(matches) == 1 else split


def cmd_eval(args: argparse.Namespace) -> int:
    """Score a run on a corpus split: BLEU and chrF for translation, perplexity for a LM."""
    from attnkit.data import corpus_files, read_lines

    model, tokenizer = _load_run(args)
    saved = _run_data_defaults(Path(args.run_dir))
    translation = model.config.shape == "encoder-decoder"
    corpus = (
        args.corpus or saved.get("corpus") or ("multi30k" if translation else "tinyshakespeare")
    )
    data_dir = args.data_dir or saved.get("data_dir")
    split = _split_name(corpus, args.split)
    rows: list[tuple[str, str, str]] = []
    if translation:
        from attnkit.evaluate import bleu, chrf
        from attnkit.inference import translate

        langs = (
            args.src_lang or saved.get("src_lang") or "de",
            args.tgt_lang or saved.get("tgt_lang") or "en",
        )
        src_path, ref_path = corpus_files(corpus, split, langs=langs, data_dir=data_dir)
        sources, references = list(read_lines(src_path)), list(read_lines(ref_path))
        if args.limit:
            sources, references = sources[: args.limit], references[: args.limit]
        if saved.get("lowercase"):
            sources = [line.lower() for line in sources]  # references stay: BLEU is given both ways
        config = _generation_config(args, model)
        with _progress(len(sources), "translating", not args.no_progress) as bar:
            hypotheses = translate(
                model, tokenizer, sources, config, batch_size=args.batch_size, progress=bar.update
            )
        if args.output:
            Path(args.output).write_text("".join(f"{h}\n" for h in hypotheses), encoding="utf-8")
        scores = (
            bleu(hypotheses, references),
            bleu(hypotheses, references, lowercase=True),
            chrf(hypotheses, references),
        )
        for score in scores:
            rows.append((score.name, f"{score.value:.2f}", score.signature))
        what = f"{corpus} {split} {langs[0]}->{langs[1]}, {len(sources)} sentences"
    else:
        from torch.utils.data import DataLoader

        from attnkit.data import CORPORA, load_corpus
        from attnkit.evaluate import perplexity

        if corpus in CORPORA and CORPORA[corpus].langs:
            raise AttnkitError(
                f"{corpus} is a parallel corpus, but a {model.config.shape} model is scored by "
                "perplexity on running text; pass --corpus tinyshakespeare"
            )
        block = min(model.config.max_len - 1, args.block_size)
        dataset = load_corpus(
            corpus, split, tokenizer=tokenizer, data_dir=data_dir, block_size=block
        )
        loader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=dataset.collate)
        batches = list(loader)[: args.limit or None]
        score = perplexity(model, batches)
        rows.append((score.name, f"{score.value:.2f}", score.signature))
        rows.append(("loss", f"{math.log(score.value):.4f}", "nats per token, ln(perplexity)"))
        what = f"{corpus} {split}, {len(batches)} batches of {block + 1}-token blocks"
    print(f"attnkit eval {args.run_dir}: {what}")
    width = max(len(name) for name, _, _ in rows)
    print(f"{'metric':<{width}}  {'score':>8}  signature")
    for name, value, signature in rows:
        print(f"{name:<{width}}  {value:>8}  {signature}")
    return 0


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (config, weights, tokenizer)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: 1)")
    p.add_argument(
        "--max-new-tokens", type=int, default=0, help="most new tokens (default: max_len - 1)"
    )
    p.add_argument("--no-repeat-ngram-size", type=int, default=0, help="forbid repeated n-grams")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1 is off")


def _add_beam_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=1, help="beam size (default 1: greedy)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam score / length^this")
    p.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_import_hf(args: argparse.Namespace) -> int:
    """Turn a Hugging Face folder into an attnkit run folder."""
    from attnkit.interop import import_hf

    imported = import_hf(args.src_dir, args.run_dir)
    c = imported.model.config
    print(
        f"imported {imported.model_type} as an attnkit {c.shape} model "
        f"({imported.model.num_parameters():,} parameters) into {args.run_dir}"
    )
    if imported.tokenizer is not None:
        print(f"copied {imported.tokenizer.name}")
    if imported.unused:
        print(f"not used by attnkit ({len(imported.unused)} tensors): {', '.join(imported.unused)}")
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    """Turn an attnkit run folder into a Hugging Face folder."""
    from attnkit.interop import export_hf

    out = export_hf(args.run_dir, args.out_dir)
    print(f"exported {args.run_dir} to {out} (config.json, model.safetensors)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="train a small model on a built-in task in about a minute")
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-examples", type=int, default=1000, help="held-out strings to score")
    p.add_argument("--out", default="attnkit-demo", help="folder for the heat map")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: 1)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a run config (TOML)")
    p.add_argument("config", help="run config, e.g. configs/multi30k_de_en.toml")
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one config key (repeatable), e.g. --set train.lr=5e-4",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in train.out_dir")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("translate", help="translate lines with an encoder-decoder run")
    _add_run_options(p)
    _add_beam_options(p)
    p.add_argument("--input", help="a text file, one sentence a line (default: stdin)")
    p.add_argument("--output", help="write the translations here (default: stdout)")
    p.add_argument(
        "--refuse-long", action="store_true", help="stop on inputs over max_len, not cut them"
    )
    p.add_argument("--attention-plot", metavar="PNG", help="draw the first input's cross-attention")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("generate", help="continue a prompt with a language-model run, streaming")
    _add_run_options(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--greedy", dest="sample", action="store_false", help="argmax, not sampling")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("eval", help="BLEU/chrF (translation) or perplexity (language model)")
    _add_run_options(p)
    _add_beam_options(p)
    p.add_argument("--split", help="corpus split (default: test, or val where there is no test)")
    p.add_argument(
        "--corpus", help="multi30k or tinyshakespeare (default: the run's, else by model shape)"
    )
    p.add_argument("--src-lang", help="source language (default: the run's, else de)")
    p.add_argument("--tgt-lang", help="target language (default: the run's, else en)")
    p.add_argument("--data-dir", help="folder holding <corpus>/<files> (see attnkit.data)")
    p.add_argument("--limit", type=int, default=0, help="score only the first N sentences/batches")
    p.add_argument("--block-size", type=int, default=256, help="language-model context per block")
    p.add_argument("--output", help="also write the translations here")
    p.set_defaults(func=cmd_eval)

    hf_folder = "a Hugging Face folder (config.json, model.safetensors): gpt2, bert or marian"
    for name, func, folders in (
        ("import", cmd_import_hf, (("src_dir", hf_folder), ("run_dir", "attnkit run folder"))),
        ("export", cmd_export_hf, (("run_dir", "attnkit run folder"), ("out_dir", hf_folder))),
    ):
        p = sub.add_parser(name, help=f"{name} a model as a Hugging Face folder: {name} hf ...")
        formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
        q = formats.add_parser("hf", help=hf_folder)
        for folder, text in folders:
            q.add_argument(folder, help=text)
        q.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except AttnkitError as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
