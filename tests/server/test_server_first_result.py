"""The hand-over from a suspended kernel to its user's first result: the cell runs as soon
as the kernel holds its state, and the restore event tells where the time went."""

from __future__ import annotations

from server_helpers import next_event, poll, start_session, text_of

from jupyter_ckpt.store.mapping import MAP_MIN_BYTES

N = MAP_MIN_BYTES // 8 + 1  # an array large enough to be mapped rather than read


async def test_the_restore_event_has_the_hand_overs_timeline(jp_fetch, connect, manager, events):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute(f"import numpy as np\nbig = np.arange({N})")
    image = await manager.suspend(kernel_id)

    reply, outputs = await (await connect(kernel_id)).execute("print(int(big[-1]))")
    assert (reply["status"], text_of(outputs)) == ("ok", f"{N - 1}\n")
    restore = await next_event(events, "restore", kernel_id=kernel_id)
    timeline = restore["timeline"]
    steps = [step["step"] for step in timeline]
    assert steps[:3] == ["compatibility checked", "kernel started", "restore request sent"]
    for step in ("manifest", "read", "unpickle", "kernel idle", "record written"):
        assert step in steps, steps
    assert steps.count("queued messages delivered") == 1
    ends = [step["at"] for step in timeline]
    assert ends == sorted(ends) and ends[-1] <= restore["seconds"]
    assert all(step["seconds"] >= 0 for step in timeline)
    assert restore["mapped_bytes"] == N * 8
    # the running record follows the hand-over, naming the image the kernel came from
    await poll(
        lambda: (
            [(r["state"], r["image_id"]) for r in manager.records.all()[0].values()]
            == [("running", image["id"])]
        ),
        what="the running record",
    )
