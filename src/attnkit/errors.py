"""The one exception type attnkit raises for bad input.

Every message is one sentence that says what is wrong and what to do, so the
command line can print it as it is instead of a traceback.
"""


class AttnkitError(ValueError):
    """Bad input to attnkit: a config, a tensor, a file or an option."""
