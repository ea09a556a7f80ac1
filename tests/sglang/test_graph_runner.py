"""The ``sglang_fl`` backend's graph-runner interface and sglang-fl's CPU graph runner, in process.

On SGLang's real KV pools and ``RadixAttention`` layers, no engine:

- a decode step through the backend compiles with ``torch.compile(fullgraph=True)`` after
  ``init_cpu_graph_state`` (no graph break: every layer's attention is one custom op reading
  the graph-mode plan), gives the eager outputs, and the next step (other requests, other
  lengths, the plan rewritten in place) reuses the compiled graph: no recompile per layer,
  none per step;
- CUDA graphs are refused before anything is captured, naming the reference attention (its
  per-request loop reads host lengths) and why;
- sglang-fl's CPU graph runner refuses to start when the backend refuses, before capture, and
  lets SGLang's fake registrations skip the ``sgl_kernel`` operators that do not exist here;
- SGLang's residual stream (every decoder layer's) breaks a compiled graph with its
  ``msgspec.Struct`` objects and compiles whole once they are rebound to plain classes
  (``traceable.py``), which behave as the structs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from backend_forward import batch, pools

pytest.importorskip("sglang")

LAYERS = 2
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


@pytest.fixture(autouse=True)
def no_graph_mode_left(router: Any) -> Any:
    """A backend's graph state puts the process's runtime in graph mode: undone after."""
    yield
    router.runtime.graph_mode = None


def _backend(router: Any) -> tuple[Any, Any, Any, list[Any]]:
    from sglang.srt.layers.radix_attention import RadixAttention

    from sglang_fl.integrations.sglang import attention_backend

    kv, req = pools()
    runner = SimpleNamespace(device="cpu", req_to_token_pool=req, token_to_kv_pool=kv, page_size=1)
    backend = attention_backend.create_backend(runner)
    layers = [RadixAttention(HEADS, HEAD_DIM, 0.25, KV_HEADS, layer_id=i) for i in range(LAYERS)]
    return backend, kv, req, layers


def _decode(backend: Any, layers: list[Any], fb: Any, q: torch.Tensor, kv: Any) -> torch.Tensor:
    outs = []
    for layer in layers:
        outs.append(backend.forward_decode(q, kv[0], kv[1], layer, fb))
    return torch.stack(outs)


def test_a_decode_step_compiles_fullgraph_and_the_next_step_reuses_it(router: Any) -> None:
    from torch._dynamo.utils import counters

    backend, kv, req, layers = _backend(router)
    prefill = batch(req, [9, 14], [0, 6], decode=False)
    backend.init_forward_metadata(prefill)
    tokens = prefill.out_cache_loc.shape[0]
    for layer in layers:  # fills the pool; binds each layer's kernels (eagerly, once)
        q = torch.randn(tokens, HEADS * HEAD_DIM)
        k, v = torch.randn(tokens, KV_HEADS, HEAD_DIM), torch.randn(tokens, KV_HEADS, HEAD_DIM)
        backend.forward_extend(q, k, v, layer, prefill)
    backend.init_cpu_graph_state(4, 4)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q, k, v, fb: _decode(backend, layers, fb, q, (k, v)), fullgraph=True, dynamic=False
    )
    for step, lens in enumerate(([10, 15], [11, 16])):
        fb = batch(req, lens, [n - 1 for n in lens], decode=True)
        q = torch.randn(2, HEADS * HEAD_DIM)
        k, v = torch.randn(2, KV_HEADS, HEAD_DIM), torch.randn(2, KV_HEADS, HEAD_DIM)
        backend.init_forward_metadata(fb)
        graphs = counters["stats"]["unique_graphs"]
        snapshot = [kv.get_key_buffer(i).clone() for i in range(LAYERS)]
        got = compiled(q, k, v, fb)
        for i, buffer in enumerate(snapshot):  # the eager run writes the same K/V again
            kv.get_key_buffer(i).copy_(buffer)
        backend.init_forward_metadata(fb)
        want = _decode(backend, layers, fb, q, (k, v))
        assert torch.allclose(got, want, atol=1e-6), f"step {step}"
        if step == 1:
            assert counters["stats"]["unique_graphs"] == graphs, "the next step recompiled"
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_cuda_graphs_are_refused_before_capture_naming_the_reference(router: Any) -> None:
    from sglang_fl.errors import GraphModeRefused

    backend, _, _, _ = _backend(router)
    with pytest.raises(GraphModeRefused) as info:
        backend.init_cuda_graph_state(4, 4)
    message = str(info.value)
    assert "captured graph runner" in message
    assert "reference.decode_attention" in message
    assert "loops over the requests" in message
    assert backend.plans.graph is None  # nothing allocated


def test_the_cpu_graph_runner_refuses_before_capture(router: Any) -> None:
    from sglang_fl.errors import GraphModeRefused
    from sglang_fl.integrations.sglang.graph_runner import cpu_graph_runner_class

    refusing = SimpleNamespace(graph_problem=lambda mode: f"no {mode} here")
    runner = SimpleNamespace(attn_backend=SimpleNamespace(attn_backend_list=[refusing]))
    with pytest.raises(GraphModeRefused, match="before capture: no compiled here"):
        cpu_graph_runner_class()(runner)  # nothing else of the model runner is read


def test_sglangs_fake_registrations_skip_sgl_kernel_ops_that_do_not_exist(router: Any) -> None:
    from sglang.srt.model_executor import cpu_graph_runner

    from sglang_fl.integrations.sglang.graph_runner import _existing_sgl_kernel_fakes

    if hasattr(getattr(torch.ops, "sgl_kernel", None), "shm_allreduce"):
        pytest.skip("this environment has sgl_kernel's CPU operators")
    with pytest.raises(RuntimeError, match="does not exist"):  # the control: SGLang's own
        cpu_graph_runner.register_fake_ops(1)
    with _existing_sgl_kernel_fakes():
        cpu_graph_runner.register_fake_ops(1)  # every missing operator skipped
    assert cpu_graph_runner.register_cpu_compile_fake.__name__ == "register_cpu_compile_fake"


def _residual_step(x: torch.Tensor) -> torch.Tensor:
    """SGLang's residual stream as a decoder layer drives it: record an output, read the
    stage's input, write the residual (which releases the contribution)."""
    from sglang.srt.layers.layer_boundary.residual.add_norm import PLAIN_ADD
    from sglang.srt.layers.layer_boundary.residual.stream import ResidualStream

    stream = ResidualStream()
    handle = stream.record(x * 2, PLAIN_ADD)
    value, _ = stream.input(handle)
    stream.write(value + 1)
    residual: torch.Tensor = stream.residual
    return residual


def test_sglangs_residual_stream_compiles_fullgraph_once_its_structs_are_rebound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control first: SGLang's own ``msgspec.Struct`` breaks the graph; rebound to the
    plain classes (restored after the test), the same SGLang code compiles whole."""
    import importlib

    from sglang_fl.integrations.sglang import traceable

    x = torch.arange(4.0)
    want = _residual_step(x)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"object\.__new__"):
        torch.compile(_residual_step, fullgraph=True, backend="eager")(x)
    for module_name, name, _fields in traceable.TRACEABLE_STRUCTS:
        module = importlib.import_module(module_name)
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    rebound = [traceable._rebind(*entry) for entry in traceable.TRACEABLE_STRUCTS]
    assert [r.rebound for r in rebound] == [True, True], rebound
    torch._dynamo.reset()
    got = torch.compile(_residual_step, fullgraph=True, backend="eager")(x)
    assert torch.equal(got, want)


def test_a_plain_class_behaves_as_the_struct() -> None:
    from sglang.srt.layers.layer_boundary.exit import ExitDecision
    from sglang.srt.layers.layer_boundary.residual.stream import Contribution

    from sglang_fl.integrations.sglang.traceable import plain_class

    plain = plain_class(Contribution)
    for cls in (Contribution, plain):
        made = cls(torch.ones(1), None)
        assert made.owed is None
        assert made.for_boundary() is made.value
        assert made.complete() is made.value
        made.release()
        assert (made.value, made.update, made.owed) == (None, None, None)
    assert plain.__name__ == "Contribution"
    assert plain.__module__ == Contribution.__module__
    decision_class = plain_class(ExitDecision)
    decision = decision_class(False, True, complete=print)
    assert decision == decision_class(False, True, print)
    assert repr(decision) == repr(ExitDecision(False, True, print))
    assert hash(decision) == hash(decision_class(False, True, print))


def test_a_struct_unlike_the_expected_one_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_fl.integrations.sglang import traceable

    entry = traceable.TRACEABLE_STRUCTS[0]
    result = traceable._rebind(entry[0], entry[1], ("value", "other"))
    assert not result.rebound
    assert "not the expected" in result.reason
    assert not traceable._rebind(entry[0], "Missing", ()).rebound
    assert "not importable" in traceable._rebind("sglang.no_such_module", "X", ()).reason
