"""The import path users know (`from attnkit.generate import generate, stream`).

Decoding lives in the package `attnkit.generation`; this module re-exports its public names.
"""

from attnkit.generation import *  # noqa: F403
