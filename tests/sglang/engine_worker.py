"""One ``sglang.Engine`` on the CPU, serving the tests' requests until told to stop.

``python engine_worker.py SPEC_JSON REPLY_FD``: ``SPEC_JSON`` holds ``model_dir``, ``dtype`` and
``server_args``; the engine starts with them (``engine_run.start_engine``), then the worker
reads one JSON request per line on stdin and writes one JSON reply per line to the file
descriptor ``REPLY_FD`` (SGLang's own logging keeps stdout and stderr). Requests:

- ``{"op": "generate", "kwargs": {...}}``: ``engine.generate(**kwargs)``, the reply's
  ``result`` always a list of outputs (``text``, ``output_ids``, ``meta_info``);
- ``{"op": "tokenize", "text": ...}``: the prompt's token ids, as the engine's tokenizer makes them;
- ``{"op": "flush_cache"}``: ``engine.flush_cache()`` (the radix cache emptied), its result;
- ``{"op": "shutdown"}``: ``engine.shutdown()``, then exit 0.

The first reply is ``{"ready": true, "pid": ...}`` once the engine serves, or ``{"error": ...}``
(with the traceback) if it could not start. ``tests/sglang/engines.py`` drives this.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import IO, Any

from engine_run import start_engine


def _reply(out: IO[str], payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload, default=repr) + "\n")
    out.flush()


def _serve(engine: Any, request: dict[str, Any]) -> Any:
    op = request["op"]
    if op == "generate":
        result = engine.generate(**request["kwargs"])
        return result if isinstance(result, list) else [result]
    if op == "tokenize":
        ids: list[int] = engine.tokenizer_manager.tokenizer(request["text"])["input_ids"]
        return ids
    if op == "flush_cache":
        return repr(engine.flush_cache())
    raise ValueError(f"unknown request {op!r}; known: generate, tokenize, flush_cache, shutdown")


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    out = os.fdopen(int(argv[1]), "w")
    try:
        engine = start_engine(spec["model_dir"], spec["dtype"], **spec["server_args"])
    except BaseException:
        _reply(out, {"error": traceback.format_exc()})
        return 1
    _reply(out, {"ready": True, "pid": os.getpid()})
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if request["op"] == "shutdown":
                break
            try:
                _reply(out, {"result": _serve(engine, request)})
            except Exception:
                _reply(out, {"error": traceback.format_exc()})
    finally:
        engine.shutdown()
    _reply(out, {"stopped": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
