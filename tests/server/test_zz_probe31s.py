import json
import pytest
from server_helpers import poll, start_session, text_of

PROBE = ("import json, os, sys; print(json.dumps([globals().get('__session__'), os.environ.get('JPY_SESSION_NAME'), "
         "os.getcwd(), get_ipython().execution_count, len(In), _ih[1][:20], repr(_)[:30], sorted(k for k in Out)[:3], "
         "os.path.basename(sys.argv[-1]), __import__('ipykernel.kernelapp').kernelapp.IPKernelApp.instance().connection_file.split('/')[-1], "
         "os.environ.get('CKPT_SPEC_ENV'), os.environ.get('PYTHONHASHSEED') is not None]))")

@pytest.mark.parametrize("standby", [True, False])
async def test_probe(jp_fetch, connect, manager, monitor, tmp_path, standby):
    manager.standby_kernel = standby
    _, kernel_id = await start_session(jp_fetch, "sub/probe.ipynb")
    client = await connect(kernel_id)
    reply, outputs = await client.execute("x = 1\nx + 41")
    reply, outputs = await client.execute(PROBE)
    assert reply["status"] == "ok", text_of(outputs)
    before = json.loads(text_of(outputs))
    km = manager.kernel_manager
    await poll(lambda: km.get_kernel(kernel_id).execution_state == "idle", what="idle")
    manager.policy.idle_timeout = 0.1
    async def suspended_when_idle():
        return kernel_id in await monitor.tick()
    await poll(suspended_when_idle, timeout=120, what="suspend")
    manager.policy.idle_timeout = 3600
    client = await connect(kernel_id)
    reply, outputs = await client.execute(PROBE)
    after = json.loads(text_of(outputs))
    print("\nBEFORE", before, "\nAFTER ", after)
    assert before[:3] == after[:3]
    assert 0
