"""Objects that real notebooks hold and that once did not come back (found by the corpus,
tests/test_corpus.py): classes with static and class methods, which were refused as
unpicklable, and the gradients of tensors and parameters, which were silently dropped
(a training loop restored after ``loss.backward()`` then fails on ``w.grad.zero_()``)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import load_namespace, save_namespace

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore

CLASSES = """
class Array:
    count = 0
    def __init__(self, values):
        self.values = values
    @classmethod
    def of(cls, *values):
        cls.count += 1
        return cls(list(values))
    @staticmethod
    def describe():
        return "an array"
    @property
    def size(self):
        return len(self.values)
made = Array.of(1, 2, 3)
"""


def run(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(code, namespace)
    del namespace["__name__"], namespace["__builtins__"]
    return namespace


def test_classes_with_static_and_class_methods_come_back(store: ImageStore) -> None:
    manifest = save_namespace(store, run(CLASSES))
    restored: dict[str, Any] = {"__name__": "__main__"}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    assert report.missing == {}
    array = restored["Array"]
    assert array.describe() == "an array"
    made = array.of(4, 5)
    assert type(made) is array and made.size == 2 and array.count == 2
    assert type(restored["made"]) is array and restored["made"].size == 3


def test_gradients_of_tensors_and_parameters_come_back(store: ImageStore) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    w = torch.randn(4, 3, requires_grad=True)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    loss = model(x.mm(w)).pow(2).sum()
    loss.backward()
    namespace = {"w": w, "model": model, "opt": opt, "x": x, "no_grad": torch.ones(2)}
    save_namespace(store, namespace)
    restored = load_namespace(store, "test")

    assert torch.equal(restored["w"].grad, w.grad)
    for before, after in zip(model.parameters(), restored["model"].parameters(), strict=True):
        assert isinstance(after, torch.nn.Parameter)
        assert torch.equal(after.grad, before.grad)
    assert restored["no_grad"].grad is None
    # the optimizer holds the same parameters, and a step reads their gradients
    assert restored["opt"].param_groups[0]["params"][0] is restored["model"].weight
    restored["opt"].step()
    opt.step()
    assert torch.equal(restored["model"].weight, model.weight)


def test_unevaluated_sympy_expressions_stay_unevaluated(store: ImageStore) -> None:
    """SymPy's own pickling rebuilds an expression by calling its class, which evaluates
    it: ``sympify("x + x", evaluate=False)`` came back as ``2*x``."""
    sympy = pytest.importorskip("sympy")
    x = sympy.Symbol("x")
    namespace = {
        "held": sympy.sympify("x + x", evaluate=False),
        "power": sympy.Pow(x, 1, evaluate=False),
        "plain": sympy.sin(x) ** 2 + sympy.Rational(1, 3),
        "x": x,
    }
    save_namespace(store, namespace)
    restored = load_namespace(store, "test")
    for name, value in namespace.items():
        assert sympy.srepr(restored[name]) == sympy.srepr(value), name
    assert restored["x"] is x  # symbols are still SymPy's cached ones
    assert restored["plain"] == namespace["plain"]


def test_polynomials_come_back(store: ImageStore) -> None:
    """A polynomial checks its generators as it is built: it is rebuilt as SymPy does."""
    sympy = pytest.importorskip("sympy")
    lamda = sympy.Symbol("lamda")
    namespace = {"p": sympy.Matrix([[1, 2], [3, 4]]).charpoly(lamda)}
    save_namespace(store, namespace)
    assert load_namespace(store, "test")["p"] == namespace["p"]
