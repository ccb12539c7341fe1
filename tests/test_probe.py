"""The cheap look for variables that cannot be saved agrees with the pickler on the
top-level objects it asks about, and asks each value once."""

from __future__ import annotations

import io
import socket
import threading
from typing import Any

import numpy as np
import pytest

from jupyter_ckpt.kernel.probe import Probe, why_unsaveable


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


@pytest.mark.parametrize(
    "value",
    [1, "s", [1, 2], {"a": (1,)}, np.zeros(3), Point(1), Point, print, io.BytesIO(b"x")],
)
def test_saveable_values_pass(value: Any) -> None:
    assert why_unsaveable(value) is None


def test_unsaveable_values_say_why_as_the_pickler_does(tmp_path: Any) -> None:
    with (tmp_path / "f").open("w") as fh, socket.socket() as sock:
        found = {
            name: why_unsaveable(value)
            for name, value in {
                "gen": (i for i in range(3)),
                "lock": threading.Lock(),
                "fh": fh,
                "sock": sock,
            }.items()
        }
    assert found["gen"] == "TypeError: cannot pickle 'generator' object"
    assert found["lock"] == "TypeError: cannot pickle '_thread.lock' object"
    assert found["fh"] is not None and "cannot save an open file" in found["fh"]
    assert found["sock"] is not None and "cannot pickle 'socket' object" in found["sock"]


def test_a_value_is_looked_at_once_and_excluded_names_never() -> None:
    asked: list[int] = []

    class Counted:
        def __reduce_ex__(self, protocol: int) -> Any:
            asked.append(protocol)
            raise TypeError("cannot pickle 'Counted' object")

    probe = Probe()
    namespace: dict[str, Any] = {"c": Counted(), "gen": (i for i in range(3))}
    assert set(probe.look(namespace, set())) == {"c", "gen"}
    assert set(probe.look(namespace, set())) == {"c", "gen"}
    assert len(asked) == 1, "an unchanged value is not asked again"
    assert set(probe.look(namespace, {"gen"})) == {"c"}
    namespace["c"] = 2
    assert probe.look(namespace, {"gen"}) == {}
