"""The I/O every command shares: durable files, the run-folder lock, checkpoint inspection and loading.

`files`: atomic writes, fsync, hashing, the output-folder and output-file locks. `checkpoints`: checking a `save_pretrained` folder
before loading it, reading what it is, and loading a model with its tokenizer (`load_model_and_tokenizer`).
"""

from .checkpoints import ModelInfo, inspect_checkpoint, load_model_and_tokenizer, load_tokenizer
from .files import atomic_write_json, atomic_write_text, file_lock, folder_lock, sha256_files

__all__ = [
    "ModelInfo",
    "atomic_write_json",
    "atomic_write_text",
    "file_lock",
    "folder_lock",
    "inspect_checkpoint",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "sha256_files",
]
