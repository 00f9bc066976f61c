"""Interop with Hugging Face checkpoints: GPT-2, BERT and Marian, both ways."""

from attnkit.interop.hf import (
    FAMILIES,
    Imported,
    export_hf,
    family_for,
    from_pretrained,
    import_hf,
    load_hf,
    save_hf,
)

__all__ = [
    "FAMILIES",
    "Imported",
    "export_hf",
    "family_for",
    "from_pretrained",
    "import_hf",
    "load_hf",
    "save_hf",
]
