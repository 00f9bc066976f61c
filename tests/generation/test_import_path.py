"""`attnkit.generate`, the import path users know, offers what `attnkit.generation` does."""

import attnkit.generation
from attnkit.generate import GenerationConfig, generate, stream


def test_attnkit_generate_re_exports_the_generation_package() -> None:
    assert (generate, stream, GenerationConfig) == (
        attnkit.generation.generate,
        attnkit.generation.stream,
        attnkit.generation.GenerationConfig,
    )
    everything: dict = {}
    exec("from attnkit.generate import *", everything)
    for name in attnkit.generation.__all__:
        assert everything[name] is getattr(attnkit.generation, name), name
