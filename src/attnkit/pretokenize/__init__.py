"""Pre-tokenization: the words a tokenizer or a word-vector vocabulary is given.

- `pipeline`: the steps in order and their settings, the [pretokenize] section (`Pretokenizer`)
- `phrases`: Mikolov et al.'s phrase detection ("new york" -> "new_york"), as gensim's
- `segment`: jieba's words for Chinese text
- `stopwords`: spaCy's stop-word lists, or the user's
- `stems`: Snowball's stems and simplemma's lemmas

Nothing here imports the tokenizer, which imports this.
"""

from attnkit.pretokenize.pipeline import PretokenizeConfig, Pretokenizer

__all__ = ["PretokenizeConfig", "Pretokenizer"]
