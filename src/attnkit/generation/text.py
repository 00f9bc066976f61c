"""Text as tokens come: each new piece of an output, cut at a stop string, and each token's text.

The text of n tokens is the tokenizer's decoding of all n (so the pieces of a
stream join into exactly the text a whole answer gets); a token that ends
inside a character (byte-level tokenizers) waits for the rest. A stop string
ends the output where it begins, the stop string left out, as OpenAI's `stop`
does; while the text ends with the start of a stop string, that end is held
back, so a stream never sends text that a stop string then takes back.
"""

from __future__ import annotations

from attnkit.tokenizer import Tokenizer


class TextState:
    """The text of one output as its tokens arrive (`add`), with what is still to be sent."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: tuple[str, ...] = (),
        context: list[int] | None = None,
        whole: bool = False,
    ) -> None:
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.context = context or []  # a decoder's prompt: the text continues it
        # Only the whole text is read (a caller that does not stream, without stop strings):
        # it is decoded once, at the end, not at every token.
        self.whole = whole and not self.stop
        self.ids: list[int] = []
        self.text = ""  # the text so far, cut at a stop string once one came
        self.sent = 0  # characters of `text` handed out
        self.stopped = False  # a stop string came

    def add(self, token: int) -> str:
        """Take one more token; return the text that may be sent now (maybe none)."""
        self.ids.append(token)
        if self.whole:
            return ""
        text = self.tokenizer.decode_continuation(self.context, self.ids)
        if text.endswith("\ufffd"):  # the token ends inside a character
            return ""
        self.text = text
        if self.stop:
            # A stop string can begin at most (longest - 1) characters before the new text.
            start = max(0, self.sent - max(len(s) for s in self.stop) + 1)
            found = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
            if found:
                self.text, self.stopped = text[: min(found)], True
                return self.flush()
        end = len(self.text) - self._held()
        piece, self.sent = self.text[self.sent : end], max(self.sent, end)
        return piece

    def flush(self) -> str:
        """The text not sent yet, at the output's end."""
        if self.whole:
            self.text = self.tokenizer.decode_continuation(self.context, self.ids)
        piece, self.sent = self.text[self.sent :], len(self.text)
        return piece

    def _held(self) -> int:
        """How many characters at the end of the text could begin a stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


def token_text(tokenizer: Tokenizer, previous: int | None, token: int) -> str:
    """The text `token` adds after `previous` (None: at the start), as its decoding shows it.

    Decoded beside its predecessor, so that a word's leading space survives the
    decoders that drop one at the start of a text; a token that shows as nothing (a
    special token, part of a character) is named by its vocabulary entry.
    """
    if previous is None:
        text = tokenizer.decode([token])
    else:
        text = tokenizer.decode([previous, token])[len(tokenizer.decode([previous])) :]
    return text or tokenizer.id_to_token(token) or ""
