"""`attnkit embed`: word vectors from the command line, and an encoder run's sentence vectors.

VECTORS is a word2vec or GloVe run folder (its vectors.bin), the run folder of
a trained model (the rows of its token embedding, each as the word its token
stands for: `attnkit.embeddings.from_model`), or a vector file in the word2vec
text or binary format or GloVe's text format (told apart by itself).

    attnkit embed nearest VECTORS WORD [-k 10]
    attnkit embed similarity VECTORS WORD WORD
    attnkit embed analogy VECTORS A B C        A is to B as C is to ?  (B - A + C)
    attnkit embed eval VECTORS                 WordSim-353, SimLex-999, Google analogies
    attnkit embed export VECTORS OUT [--binary]   (a model's run folder: its embeddings' vectors)
    attnkit embed plot VECTORS PNG WORD...     the words on their first two principal components
    attnkit embed plot VECTORS PNG WORD... --strips [--dims N]
                                               each word's vector as a strip of colours
    attnkit embed positions PNG [--layout split] [--dims 4 5 6 7]
                                               the sinusoidal positional encoding, three ways
    attnkit embed sentences RUN TEXT TEXT...   an encoder run's sentence vectors, pooled as the
                                               run pools: their cosines, each pair
    attnkit embed retrieval RUN [--split S]    a sentence-embedding run: each source's nearest
                                               target its own translation? (`embedding_task`)
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_embed_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed", help="query, score, export and draw word vectors; sentence vectors of a run"
    )
    commands = p.add_subparsers(dest="embed_command", required=True, metavar="COMMAND")

    def command(name: str, help: str, func, words: dict | None = None) -> argparse.ArgumentParser:
        q = commands.add_parser(name, help=help)
        q.add_argument("vectors", help="a run folder (word vectors or a model) or a vector file")
        for word, text in (words or {}).items():
            q.add_argument(word, help=text)
        q.add_argument(
            "--format",
            default="auto",
            help="word2vec, word2vec-binary or glove (default auto: told by the file itself)",
        )
        q.add_argument("--limit", type=_positive, help="read only the first N words (default: all)")
        q.add_argument(
            "--side", choices=("target", "source"), default="target",
            help="a translation model's run folder: the decoder's (target) or encoder's embedding",
        )  # fmt: skip
        q.set_defaults(func=func)
        return q

    q = command("nearest", "the words closest to a word", cmd_nearest, {"word": "the word asked"})
    q.add_argument("-k", type=_positive, default=10, help="how many (default 10)")
    pair = {"word": "the first word", "other": "the second word"}
    command("similarity", "the cosine of two words", cmd_similarity, pair)
    terms = {"a": "A, as man", "b": "B, as king", "c": "C, as woman (the answer: queen)"}
    q = command("analogy", "A is to B as C is to ? (3CosAdd)", cmd_analogy, terms)
    q.add_argument("-k", type=_positive, default=5, help="how many answers (default 5)")
    q = command("eval", "Spearman on WordSim-353 and SimLex-999, analogy accuracy", cmd_eval)
    q.add_argument(
        "--restrict",
        type=_positive,
        default=300_000,
        help="search the first N words (default 300000)",
    )
    q = command("export", "write the vectors in word2vec's text or binary format", cmd_export)
    q.add_argument("out", help="the file to write")
    q.add_argument("--binary", action="store_true", help="the binary format (default: text)")
    q = command("plot", "draw words on their first two principal components", cmd_plot)
    q.add_argument("png", help="the picture to write")
    q.add_argument("words", nargs="+", help="three words or more (one or more with --strips)")
    q.add_argument("--strips", action="store_true", help="each vector as a strip of colours")
    q.add_argument("--dims", type=_positive, help="with --strips: the first N dimensions")

    q = commands.add_parser("positions", help="draw the sinusoidal positional encoding")
    q.add_argument("png", help="the picture to write")
    q.add_argument(
        "--d-model", type=int, default=128,
        help="dimensions drawn (default 128); --length x --d-model is at most 1,000,000",
    )  # fmt: skip
    q.add_argument(
        "--length", type=int, default=100,
        help="positions drawn (default 100); --length x --d-model is at most 1,000,000 "
        "(attnkit.viz.POSITION_PICTURE_CELLS)",
    )  # fmt: skip
    q.add_argument(
        "--layout", choices=("interleaved", "split"), default="interleaved",
        help="interleaved: sin and cos alternate (the paper); split: sines, then cosines",
    )  # fmt: skip
    q.add_argument("--dims", type=int, nargs="+", help="the dimensions drawn as curves")
    q.set_defaults(func=cmd_positions)

    q = commands.add_parser("sentences", help="the cosines of sentence vectors of an encoder run")
    q.add_argument("run", help="an encoder's run folder (its pooling.json says how it pools)")
    q.add_argument("texts", nargs="+", help="two sentences or more")
    q.set_defaults(func=cmd_sentences)
    q = commands.add_parser(
        "retrieval", help="a sentence-embedding run's retrieval accuracy on a split"
    )
    q.add_argument("run", help="the run folder of a data.task = 'sentence-embedding' run")
    q.add_argument("--split", default="test", help="the corpus split (default test)")
    q.set_defaults(func=cmd_retrieval)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more is needed, not {text!r}")
    return int(text)


def _load(args: argparse.Namespace):
    from attnkit.embeddings.vectors import WordVectors, load_vectors
    from attnkit.run import RunFolder

    path = Path(args.vectors)
    if path.is_dir():
        folder = RunFolder(path)
        if not folder.vectors.is_file() and folder.weights.is_file():
            from attnkit.embeddings.from_model import model_vectors
            from attnkit.run import load_pretrained

            vectors = model_vectors(load_pretrained(path), folder.load_tokenizer(), args.side)
            limit = args.limit or len(vectors)
            return WordVectors(vectors.words[:limit], vectors.vectors[:limit])
        path = folder.vectors
    return load_vectors(path, format=args.format, limit=args.limit)


def _output(args: argparse.Namespace, path: str, what: str) -> None:
    """Stop before any work when `path` cannot be written or is one of the vectors' files
    (a picture: or has no picture type as its suffix)."""
    from attnkit.files import check_writable
    from attnkit.run import RunFolder

    vectors = Path(args.vectors)
    inputs = RunFolder(vectors).inputs() if vectors.is_dir() else [("VECTORS", vectors)]
    if what == "PNG":
        from attnkit.viz import check_picture

        check_picture(path, what, inputs)
    else:
        check_writable(path, what, inputs=inputs)


def _print_scored(rows: list[tuple[str, float]]) -> None:
    for word, score in rows:
        print(f"{score:.4f}  {word}")


def cmd_nearest(args: argparse.Namespace) -> int:
    _print_scored(_load(args).nearest(args.word, k=args.k))
    return 0


def cmd_similarity(args: argparse.Namespace) -> int:
    print(f"{_load(args).similarity(args.word, args.other):.4f}")
    return 0


def cmd_analogy(args: argparse.Namespace) -> int:
    _print_scored(_load(args).analogy(args.a, args.b, args.c, k=args.k))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from attnkit.embeddings import evaluation

    vectors = _load(args)
    print(f"{len(vectors)} words of dimension {vectors.dim}")
    for name, title in (("wordsim353", "WordSim-353"), ("simlex999", "SimLex-999")):
        score = evaluation.word_similarity(vectors, evaluation.benchmark_file(name), args.restrict)
        print(
            f"{title:<12} Spearman {score.spearman:.3f}  ({score.pairs} of {score.total} pairs, "
            f"{100 * score.coverage:.0f}%)"
        )
    score = evaluation.analogies(vectors, evaluation.benchmark_file("analogies"), args.restrict)
    parts = [score.part(semantic=True), score.part(semantic=False)]
    share = f"{score.correct} of {score.asked} asked; {score.total} questions, "
    print(f"{'analogies':<12} accuracy {score.accuracy:.1%}  ({share}{score.coverage:.0%} asked)")
    for (correct, asked), kind in zip(parts, ("semantic", "syntactic"), strict=True):
        print(f"  {kind:<10} {100 * correct / max(asked, 1):.1f}%  ({correct} of {asked})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from attnkit.embeddings.vectors import save_vectors

    _output(args, args.out, "OUT")
    vectors = _load(args)
    out = save_vectors(vectors, args.out, binary=args.binary)
    print(f"wrote {len(vectors)} vectors of dimension {vectors.dim} to {out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from attnkit.viz import plot_vector_strips, plot_word_vectors

    _output(args, args.png, "PNG")
    if args.strips:
        print(f"wrote {plot_vector_strips(_load(args), args.words, args.png, dims=args.dims)}")
    else:
        print(f"wrote {plot_word_vectors(_load(args), args.words, args.png)}")
    return 0


def cmd_positions(args: argparse.Namespace) -> int:
    from attnkit.viz import check_picture, plot_positional_encoding

    check_picture(args.png, "PNG")
    path = plot_positional_encoding(
        args.png, args.d_model, args.length, layout=args.layout, dims=args.dims
    )
    print(f"wrote {path}")
    return 0


def cmd_sentences(args: argparse.Namespace) -> int:
    from attnkit.run import load_run

    vectors = load_run(args.run).sentence_encoder().encode(args.texts)
    unit = vectors / vectors.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cosines = unit @ unit.T
    for i, text in enumerate(args.texts):
        print("  ".join(f"{c:7.4f}" for c in cosines[i].tolist()) + f"  {text}")
    return 0


def cmd_retrieval(args: argparse.Namespace) -> int:
    from attnkit.train.embedding_task import evaluate_run

    scores = evaluate_run(args.run, args.split)
    print(
        f"{args.split}: retrieval accuracy {scores['retrieval_accuracy']:.4f} "
        f"({scores['pairs']:,} pairs; chance {1 / scores['pairs']:.4f}), "
        f"loss {scores['val_loss']:.4f}"
    )
    return 0
