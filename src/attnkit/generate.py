"""The import path users know (`from attnkit.generate import generate, stream`).

Decoding lives in the package `attnkit.generation`; this module re-exports its public names
(`X as X` marks each as re-exported, for linters and type checkers).
"""

from attnkit.generation import LLM as LLM
from attnkit.generation import Completion as Completion
from attnkit.generation import GenerateOutput as GenerateOutput
from attnkit.generation import GenerationConfig as GenerationConfig
from attnkit.generation import Request as Request
from attnkit.generation import beam_search as beam_search
from attnkit.generation import generate as generate
from attnkit.generation import left_pad as left_pad
from attnkit.generation import stream as stream
from attnkit.generation import warp as warp
