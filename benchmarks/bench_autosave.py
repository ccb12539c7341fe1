"""Latency of a trivial cell while an autosave of a large state starts.

One real ipykernel holds ``--gib`` GiB of random float64 arrays. Each round, in rotating
order, the cell ``1 + 1`` is submitted

* **alone** (the baseline: the kernel idle);
* **autosave**: right behind the server's autosave call (``jupyter_ckpt.kernel.autosave``,
  a silent execute, as the server sends it), so the cell waits for the fork and then runs
  while the forked child writes the image;
* **blocking**: right behind a ``%ckpt save``, which writes the image in the kernel.

The latency is from submitting the cell to its execute reply. Before each save one value
in every chunk of the state changes, so every save writes the whole state (no dedupe).
Images are deleted and their chunks collected after each round.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import tempfile
import time
from typing import Any

from benchlib import human_size, make_store, table
from jupyter_client.manager import start_new_kernel

from jupyter_ckpt.store import CHUNK_SIZE

CELL = "1 + 1"


def execute(client: Any, code: str, **kw: Any) -> str:
    return client.execute(code, store_history=False, **kw)


def reply_of(client: Any, msg_id: str, timeout: float = 600) -> dict[str, Any]:
    while True:
        msg = client.get_shell_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]


def run(client: Any, code: str) -> dict[str, Any]:
    content = reply_of(client, execute(client, code))
    assert content["status"] == "ok", content
    return content


# a silent call of jupyter_ckpt.kernel.<name>, as the server makes it
KERNEL_CALL = "__import__('json').dumps(__import__('jupyter_ckpt.kernel').kernel.{})"


def send_call(client: Any, call: str) -> str:
    return client.execute(
        "", silent=True, store_history=False, user_expressions={"r": KERNEL_CALL.format(call)}
    )


def result_of(client: Any, msg_id: str) -> Any:
    result = reply_of(client, msg_id)["user_expressions"]["r"]
    assert result["status"] == "ok", result
    return json.loads(ast.literal_eval(result["data"]["text/plain"]))  # a JSON string's repr


def cell_after(client: Any, first: str | None) -> float:
    """Seconds from submitting CELL (right behind ``first``, if any) to its reply."""
    started = time.perf_counter()
    first_id = execute(client, first) if first else None
    cell_id = execute(client, CELL)
    if first_id is not None:  # replies come in order: the first request's, then the cell's
        assert reply_of(client, first_id)["status"] == "ok"
    reply_of(client, cell_id)
    return time.perf_counter() - started


def behind_call(client: Any, call: str) -> tuple[float, dict[str, Any]]:
    """CELL right behind a silent call of ``jupyter_ckpt.kernel.<call>``, as the server
    sends it; (the cell's latency, the call's result)."""
    started = time.perf_counter()
    start_id = send_call(client, call)
    cell_id = execute(client, CELL)
    result = result_of(client, start_id)
    reply_of(client, cell_id)
    return time.perf_counter() - started, result


def autosave_round(client: Any) -> tuple[float, dict[str, Any]]:
    """CELL right behind an autosave call; (latency, the autosave's start and final result)."""
    latency, begun = behind_call(client, "autosave()")
    assert begun["state"] == "started", begun
    while (done := result_of(client, send_call(client, "autosave_result()")))["state"] == "running":
        time.sleep(0.05)
    assert not done.get("error"), done
    return latency, {**begun, **done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="state size in GiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch directory (store)")
    args = parser.parse_args()
    where = tempfile.mkdtemp(prefix="bench-autosave-", dir=args.dir)
    store = make_store(where)
    os.environ.update(
        JUPYTER_CKPT_STORE=store.root_url, JUPYTER_CKPT_SECRET_FILE=store.signer.secret_file
    )
    nbytes = int(args.gib * (1 << 30))
    km, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, "%load_ext jupyter_ckpt")
        run(
            client,
            "import numpy as np\n"
            f"state = [np.random.default_rng(i).random({nbytes // 8 // 4}) for i in range(4)]",
        )
        step = CHUNK_SIZE // 8
        touch = f"for a in state: a[::{step}] += 1"  # every chunk changes: a full write
        latencies: dict[str, list[float]] = {"alone": [], "autosave": [], "blocking": []}
        details: list[str] = []
        for r in range(args.rounds):
            order = ["alone", "autosave", "blocking"]
            order = order[r % 3 :] + order[: r % 3]
            for contender in order:
                run(client, touch)
                if contender == "alone":
                    latencies["alone"].append(cell_after(client, None))
                elif contender == "autosave":
                    latency, done = autosave_round(client)
                    latencies["autosave"].append(latency)
                    details.append(
                        f"round {r + 1}: fork() took {done['fork_seconds'] * 1000:.1f} ms; "
                        f"the child wrote {human_size(done['written'])} in {done['seconds']:.1f} s"
                    )
                else:
                    latencies["blocking"].append(cell_after(client, "%ckpt save"))
            for image_id in store.image_ids():
                store.delete(image_id)
            store.gc(grace_seconds=0)
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)
    base = sorted(latencies["alone"])[len(latencies["alone"]) // 2]
    rows = []
    for contender, runs in latencies.items():
        median = sorted(runs)[len(runs) // 2]
        rows.append(
            [
                contender,
                f"{median * 1000:.1f}",
                f"{min(runs) * 1000:.1f}-{max(runs) * 1000:.1f}",
                f"{(median - base) * 1000:+.1f}",
                f"{median / base:.1f}x",
            ]
        )
    print(f"state: {human_size(nbytes)} of float64 arrays; {args.rounds} round(s); cell {CELL!r}")
    print(table(["1 + 1 submitted", "median ms", "range ms", "added ms", "vs alone"], rows))
    print("\n".join(details))


if __name__ == "__main__":
    main()
