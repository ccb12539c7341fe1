"""The kernel websocket, extended so a client can talk to a suspended kernel.

A websocket to a suspended kernel is accepted and served by :class:`SuspendedConnection`.
Reopening a notebook or console must not wake a GPU kernel, so what JupyterLab, Notebook 7
and consoles send on every connect or reconnect is answered without the kernel: kernel
info from the kernel info saved at suspend time, comm info with no comms (a restored
kernel has none), history from the input history in the kernel's image, and the
widget manager's control comm is closed as a kernel without widgets closes it; the
debugger's question about its state is answered from the facts saved at suspend. Only the
messages in :data:`WAKING` restore the kernel: running code, and completion or inspection
while the user types. Any other message (the debugger's other requests, a shutdown or
interrupt request) waits, without waking the kernel, until it is restored.
Queued messages are then handed, in order, to the server's ordinary connection, which
takes over the socket.

A socket opened while the kernel is being suspended is served here too, never attached to
the process being suspended: its messages wait for the suspend's end (a cell aborts the
suspend), then go to the process that answers them, the running kernel's or the
restored one's. A socket attached to the process, which the suspend closes once it has
committed, may still bring a message before its client has seen the close: that message
goes to the restored kernel too, and its reply waits for the client's reconnect. So a
message accepted for a kernel is delivered to the process that will answer it, or the
suspend aborts.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from typing import Any, ClassVar, cast

from jupyter_client.jsonutil import json_default
from jupyter_core.utils import ensure_async
from jupyter_server.services.kernels.connection.base import (
    BaseKernelWebsocketConnection,
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.websocket import KernelWebsocketHandler
from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Unicode

from . import compat
from .lifecycle import State
from .polling import poll
from .startup import records_loaded

V1 = "v1.kernel.websocket.jupyter.org"

# The shell messages that restore a suspended kernel: the user ran code, or typed and
# asked for completions or help, or a widget talked to the kernel. Nothing a frontend
# sends on connect is here (kernel_info, comm_info and history are answered instead, and
# so are the comms of PROBE_COMMS).
WAKING = frozenset(
    {
        "execute_request",
        "is_complete_request",
        "complete_request",
        "inspect_request",
        "comm_open",
        "comm_msg",
    }
)


# Comms a frontend opens on every connect to ask what the kernel holds: ipywidgets 8's
# widget manager opens its control comm and asks for all widget states. A suspended kernel
# answers as a kernel without that comm target does (it closes the comm), and the manager
# falls back to comm_info, which lists no comms: a restored kernel has no live widgets.
PROBE_COMMS = frozenset({"jupyter.widget.control"})


def parse_ws_message(ws_msg: str | bytes, subprotocol: str | None) -> tuple[str, dict]:
    """(channel, header) of a client message, in either websocket protocol."""
    if subprotocol == V1:
        channel, parts = deserialize_msg_from_ws_v1(ws_msg)
        return channel, json.loads(parts[0])
    msg = deserialize_binary_message(ws_msg) if isinstance(ws_msg, bytes) else json.loads(ws_msg)
    return msg.get("channel") or "shell", msg["header"]


def parse_ws_content(ws_msg: str | bytes, subprotocol: str | None) -> dict[str, Any]:
    """The content of a client message, in either websocket protocol."""
    if subprotocol == V1:
        _, parts = deserialize_msg_from_ws_v1(ws_msg)
        return json.loads(parts[3])
    msg = deserialize_binary_message(ws_msg) if isinstance(ws_msg, bytes) else json.loads(ws_msg)
    return msg.get("content") or {}


def select_history(raw: list[str], request: dict[str, Any]) -> list[list[Any]]:
    """The ``(session, line, input)`` entries of a saved input history that a
    ``history_request`` asks for (tail, range or search), as IPython would answer them
    for its current session (session 0). ``raw[0]`` is IPython's empty line 0."""
    entries: list[list[Any]] = [[0, line, text] for line, text in enumerate(raw) if line > 0]
    kind = request.get("hist_access_type")
    if kind == "range":
        start, stop = request.get("start") or 1, request.get("stop")
        entries = [e for e in entries if e[1] >= start and (stop is None or e[1] < stop)]
    elif kind == "search":
        pattern = request.get("pattern") or "*"
        entries = [e for e in entries if fnmatch.fnmatchcase(e[2], pattern)]
    if request.get("unique"):
        last = {e[2]: i for i, e in enumerate(entries)}  # keep each input's latest line
        entries = [e for i, e in enumerate(entries) if last[e[2]] == i]
    n = request.get("n")
    if kind in ("tail", "search") and n:
        entries = entries[-n:]
    return entries


class SuspendedConnection(BaseKernelWebsocketConnection):
    """Serves a websocket while its kernel is suspended; restores it when needed."""

    kernel_id = Unicode()
    manager = AnyTrait()

    # kernel id -> connections waiting for its restore that have not yet connected to the
    # new kernel. No queued message is replayed before all of them are connected: the
    # server checks a new connection's iopub subscription only while the kernel is idle,
    # so a reply to one client's queued cell must not make another client miss output.
    _unconnected: ClassVar[dict[str, set[SuspendedConnection]]] = {}
    _all_connected: ClassVar[dict[str, asyncio.Event]] = {}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._queue: list[str | bytes] = []
        self._upgrade: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()  # history replies being read
        self._probes: set[str | None] = set()  # ids of the PROBE_COMMS comms closed here
        self._closed = False
        # messages that came while the kernel was being suspended, until its suspend ends
        self._held: list[str | bytes] | None = None

    @property
    def _protocol(self) -> str | None:
        # as chosen at the handshake: tornado forgets it once the socket is closing
        return cast(CkptKernelWebsocketHandler, self.websocket_handler).subprotocol

    async def connect(self) -> None:
        counts = self.manager.kernel_manager.suspended_connections
        counts[self.kernel_id] = counts.get(self.kernel_id, 0) + 1
        # Frontends ignore the status that follows a kernel-info reply (an untracked
        # message type), so say "idle" on our own, as the server says "restarting": the
        # notebook must not look dead while its kernel is suspended.
        self._send("iopub", self.session.msg("status", {"execution_state": "idle"}))
        restoring = self.manager.lifecycles.restore_under_way(self.kernel_id)
        if self.manager.policy.restore_on == "connect" or restoring:
            # restore after the handshake: browsers give up on slow websocket upgrades. A
            # restore under way (another socket's cell, maybe this client's own before
            # its socket dropped) is joined: this socket is handed over with the others,
            # and gets the replies kept for its session, rather than wait for a message.
            self._start_restore("connect")

    def disconnect(self) -> None:  # type: ignore[override]
        if self._closed:
            return
        self._closed = True
        self._connected_to_kernel()
        counts = self.manager.kernel_manager.suspended_connections
        counts[self.kernel_id] = max(0, counts.get(self.kernel_id, 1) - 1)

    def handle_incoming_message(self, incoming_msg: str | bytes) -> None:
        channel, header = parse_ws_message(incoming_msg, self._protocol)
        waking = channel == "shell" and header.get("msg_type") in WAKING
        lifecycles = self.manager.lifecycles
        if self._held is not None or (
            self._upgrade is None and lifecycles.state(self.kernel_id) is State.SUSPENDING
        ):
            if waking:  # the user needs the kernel: the suspend stops at its next step
                self.manager.note_client_message(self.kernel_id)
            self._hold(incoming_msg)
            return
        self.manager.note_client_message(self.kernel_id)
        # another client may have restored the kernel meanwhile: then just hand over
        suspended = self.manager.kernel_manager.is_suspended(self.kernel_id)
        if self._upgrade is None and suspended:
            msg_type = header.get("msg_type")
            if msg_type == "kernel_info_request":
                info = self.manager.lifecycles[self.kernel_id].record["kernel_info"]
                self._reply(channel, header, "kernel_info_reply", info)
                return
            if msg_type == "comm_info_request":
                self._reply(channel, header, "comm_info_reply", {"status": "ok", "comms": {}})
                return
            if msg_type == "history_request":
                content = parse_ws_content(incoming_msg, self._protocol)
                self._answer_history(channel, header, content)
                return
            if msg_type in ("comm_open", "comm_msg") and self._is_probe(incoming_msg, header):
                return
            if msg_type == "debug_request" and self._answer_debug_info(
                channel, header, parse_ws_content(incoming_msg, self._protocol)
            ):
                return
        self._queue.append(incoming_msg)
        if not suspended or waking:
            self._start_restore("message")

    def _hold(self, incoming_msg: str | bytes) -> None:
        """Keep a message until the suspend under way ends, then handle it (and those
        after it, in order) as the kernel's state then says."""
        if self._held is not None:
            self._held.append(incoming_msg)
            return
        self._held = [incoming_msg]

        async def release() -> None:
            await self.manager.lifecycles.suspend_ended(self.kernel_id)
            held, self._held = self._held or [], None
            for message in held:
                self.handle_incoming_message(message)

        self._pending.add(task := asyncio.ensure_future(release()))
        task.add_done_callback(self._pending.discard)

    def _is_probe(self, incoming_msg: str | bytes, header: dict[str, Any]) -> bool:
        """Whether a comm message belongs to a PROBE_COMMS comm; its opening is answered by
        closing it, and what the frontend sends on it after that is dropped."""
        content = parse_ws_content(incoming_msg, self._protocol)
        comm_id = content.get("comm_id")
        if header["msg_type"] == "comm_open" and content.get("target_name") in PROBE_COMMS:
            self._probes.add(comm_id)
            close: dict[str, Any] = {"comm_id": comm_id, "data": {}}
            self._send("iopub", self.session.msg("comm_close", close, parent=header))
        return comm_id in self._probes

    def _answer_debug_info(self, channel: str, header: dict[str, Any], request: dict) -> bool:
        """Answer the debugger's ``debugInfo``, which JupyterLab sends on every connect to
        a kernel with a debugger, from the facts the kernel gave at suspend: not started,
        no breakpoints, as the restored kernel's debugger will be. (Left waiting, it
        fails when the socket closes: "Could not restore the debugger state".) Other
        debug requests wait for the restore."""
        saved = self.manager.lifecycles[self.kernel_id].record.get("debug_info")
        if request.get("command") != "debugInfo" or not saved:
            return False
        content = {
            "type": "response",
            "request_seq": request.get("seq"),
            "success": True,
            "command": "debugInfo",
            "body": {**saved, "isStarted": False, "breakpoints": [], "stoppedThreads": []},
        }
        self._reply(channel, header, "debug_reply", content)
        return True

    def _answer_history(self, channel: str, header: dict[str, Any], request: dict) -> None:
        """Reply to a history request from the image, read on a thread (the manifest is
        JSON: nothing is unpickled)."""
        image_id = self.manager.lifecycles[self.kernel_id].record["image_id"]

        async def answer() -> None:
            try:
                manifest = await asyncio.to_thread(self.manager.store.open, image_id)
                raw = manifest.get("kernel", {}).get("history", {}).get("raw", [])
                content = {"status": "ok", "history": select_history(raw, request)}
            except Exception as exc:
                self.log.warning("History of suspended kernel %s: %s", self.kernel_id, exc)
                content = {"status": "ok", "history": []}
            if not self._closed:
                self._reply(channel, header, "history_reply", content)

        self._pending.add(task := asyncio.ensure_future(answer()))
        task.add_done_callback(self._pending.discard)

    def _start_restore(self, trigger: str) -> None:
        if self._upgrade is None:
            self._unconnected.setdefault(self.kernel_id, set()).add(self)
            # started here, not in the task: a client connecting before the task runs
            # must see the restore under way
            restored = self.manager.restore(self.kernel_id, trigger, hand_over=True)
            self._upgrade = asyncio.ensure_future(self._restore_and_hand_over(restored))

    def _connected_to_kernel(self) -> None:
        """Leave the kernel's unconnected set; the last one out releases the others."""
        peers = self._unconnected.get(self.kernel_id)
        if peers is None or self not in peers:
            return
        peers.discard(self)
        if not peers:
            del self._unconnected[self.kernel_id]
            event = self._all_connected.pop(self.kernel_id, None)
            if event is not None:
                event.set()

    async def _wait_for_peers(self) -> None:
        self._connected_to_kernel()
        if self.kernel_id in self._unconnected:
            await self._all_connected.setdefault(self.kernel_id, asyncio.Event()).wait()

    def _send(self, channel: str, msg: dict[str, Any]) -> None:
        if self._closed:
            return  # its client reconnects, and asks again
        if self._protocol == V1:
            data = serialize_msg_to_ws_v1(msg, channel, self.session.pack)
            self.websocket_handler.write_message(data, binary=True)
        else:
            self.websocket_handler.write_message(
                json.dumps({**msg, "channel": channel}, default=json_default)
            )

    def _reply(self, channel: str, header: dict[str, Any], msg_type: str, content: dict) -> None:
        """Answer as the kernel would: the reply, then idle on iopub."""
        self._send(channel, self.session.msg(msg_type, content, parent=header))
        self._send("iopub", self.session.msg("status", {"execution_state": "idle"}, parent=header))

    async def _restore_and_hand_over(self, restored: asyncio.Future[dict[str, Any]]) -> None:
        handler = self.websocket_handler
        try:
            report = await restored
            superseded = self._superseded()
            if not self._closed and not superseded:
                await self._hand_over(report)
            elif self._queue:
                await self._deliver_offline()
            if superseded:  # the client has a newer socket: this one is stale
                self.disconnect()
                handler.close()
            self.manager.lifecycles.delivered(self.kernel_id)
        except Exception as exc:
            self.log.error("Restore of kernel %s failed: %s", self.kernel_id, exc)
            if self.kernel_id not in self.manager.kernel_manager:  # shut down meanwhile
                self._write_error(f"jupyter-ckpt: the kernel could not be started again: {exc}")
                handler.close()
            else:  # it stays suspended: the cells say why, and the next one tries again
                self._answer_failed(f"the kernel could not be started again: {exc}")
        finally:
            self._connected_to_kernel()

    def _answer_failed(self, why: str) -> None:
        """Answer the queued requests as a kernel whose cell failed would: an error
        reply to each (and the error as the cell's output), so that no cell waits."""
        queued, self._queue = self._queue, []
        self._upgrade = None
        error = {"ename": "RestoreFailed", "evalue": why, "traceback": [f"jupyter-ckpt: {why}"]}
        for message in queued:
            channel, header = parse_ws_message(message, self._protocol)
            msg_type = header.get("msg_type", "")
            if not msg_type.endswith("_request"):
                continue
            busy = self.session.msg("status", {"execution_state": "busy"}, parent=header)
            self._send("iopub", busy)
            if msg_type == "execute_request":
                self._send("iopub", self.session.msg("error", error, parent=header))
            reply = {"status": "error", **error}
            self._reply(channel, header, msg_type.replace("_request", "_reply"), reply)

    def _superseded(self) -> bool:
        """Whether another socket of this client's session is attached to the kernel: one
        it opened since (a reconnect while the server had not seen this socket drop).
        Handing this one over would replace that one as stale, and its replies with it."""
        key = f"{self.kernel_id}:{self.session.session}"
        live = compat.open_sessions().get(key)
        return live is not None and live is not self.websocket_handler

    async def _hand_over(self, report: dict[str, Any]) -> None:
        handler = cast(KernelWebsocketHandler, self.websocket_handler)
        kernel = self.manager.kernel_manager.get_kernel(self.kernel_id)
        connection = handler.kernel_websocket_connection_class(
            parent=kernel, websocket_handler=handler, config=handler.config
        )
        connection.session.session = self.session.session
        await connection.prepare()
        await ensure_async(connection.connect())
        await self._wait_for_peers()
        message = restore_message(report)
        if message:
            parent = self._first_header()
            connection.write_stderr(message, parent)
        # no await from here on: nothing can arrive between the last replay and the swap
        for queued in self._queue:
            connection.handle_incoming_message(queued)
        self._queue.clear()
        self.disconnect()
        handler.connection = connection

    async def _deliver_offline(self) -> None:
        """The socket closed during the restore, with the user's messages queued (a
        network blip while the kernel came back): send them to the kernel anyway, on the
        same session, and buffer the replies for the client's reconnect, as the server
        does for a running kernel's socket that drops. A reconnect that arrived first
        gets them on its live connection, or with its own if it is still handing over."""
        session_key = f"{self.kernel_id}:{self.session.session}"
        open_sessions = compat.open_sessions()
        live = open_sessions.get(session_key)
        if live is None:
            handler = cast(KernelWebsocketHandler, self.websocket_handler)
            kernel = self.manager.kernel_manager.get_kernel(self.kernel_id)
            own = handler.kernel_websocket_connection_class(
                parent=kernel, websocket_handler=handler, config=handler.config
            )
            own.session.session = self.session.session
            own.session.key = kernel.session.key
            own.session_key = session_key
            own.create_stream()
            await own.nudge()  # iopub is subscribed before the cell runs
            live = open_sessions.get(session_key)  # a reconnect during the nudge
            if live is None:  # no await from here to the buffering: none can slip in
                self.manager.kernel_manager.start_buffering(
                    self.kernel_id, session_key, own.channels
                )
                connection = own
            else:
                for stream in own.channels.values():
                    stream.close()
        if live is not None:
            connection = live.connection
            if isinstance(connection, SuspendedConnection):
                # a reconnect that joined the restore and is handing over: it replays
                # these first, before its own, on the session's new connection
                connection._queue[:0] = self._queue
                self._queue.clear()
                return
            # the reconnect may still be opening its streams
            await poll(lambda: bool(connection.channels), 30, 0.05)
        for queued in self._queue:
            connection.handle_incoming_message(queued)
        self._queue.clear()

    def _first_header(self) -> dict[str, Any]:
        headers = [parse_ws_message(m, self._protocol)[1] for m in self._queue]
        executes = [h for h in headers if h.get("msg_type") == "execute_request"]
        return (executes or headers or [{}])[0]

    def _write_error(self, text: str) -> None:
        content = {"name": "stderr", "text": text + "\n"}
        self._send("iopub", self.session.msg("stream", content, parent=self._first_header()))


def restore_message(report: dict[str, Any]) -> str:
    """What the user reads in the notebook after a restore that was not complete."""
    lines = [report["recovery"]] if report.get("recovery") else []
    if report.get("error"):
        lines.append(
            f"jupyter-ckpt: restoring image {report['image_id']} failed: {report['error']}. "
            "The kernel started without it; the image is kept, and protected from deletion "
            "until this kernel is shut down or restarted: load it again with "
            f"%ckpt restore {report['image_id']} or resume it from the saved sessions."
        )
    # variables left out on purpose are no failure: the client names them, and how to
    # make them again, in a notification (see the restore event's ``excluded``)
    excluded = set(report.get("excluded") or ())
    missing = {n: why for n, why in (report.get("missing") or {}).items() if n not in excluded}
    if missing:
        lines.append(f"jupyter-ckpt: {len(missing)} variable(s) not restored:")
        lines.extend(f"  {name}: {why}" for name, why in missing.items())
    lines.extend(f"jupyter-ckpt: {w}" for w in report.get("warnings") or [])
    return "\n".join(lines)


class CkptKernelWebsocketHandler(KernelWebsocketHandler):
    """The kernels websocket, accepting connections to suspended kernels."""

    _ckpt_diverted: SuspendedConnection | None = None
    subprotocol: str | None = None  # the socket's, chosen at the handshake

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        self.subprotocol = super().select_subprotocol(subprotocols)
        return self.subprotocol

    @property
    def ckpt(self) -> Any:
        return self.settings["jupyter_ckpt_manager"]

    async def pre_get(self) -> None:
        await records_loaded(self.settings)
        ckpt = self.ckpt
        if not ckpt.lifecycles.holds_sockets(self.kernel_id):
            return await super().pre_get()
        authorized = await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "execute", "kernels")
        )
        if not authorized:
            raise web.HTTPError(403)
        self.connection = SuspendedConnection(
            parent=None,
            websocket_handler=self,
            kernel_id=self.kernel_id,
            manager=ckpt,
            config=self.config,
        )
        session_id = self.get_argument("session_id", None)
        if session_id:
            self.connection.session.session = session_id

    def on_message(self, ws_message: str | bytes) -> None:
        if not isinstance(self.connection, SuspendedConnection):  # it says which count
            self.ckpt.note_client_message(self.kernel_id)
            if self._process_stopping():
                self._diverted().handle_incoming_message(ws_message)
                return
        super().on_message(ws_message)

    def _process_stopping(self) -> bool:
        """Whether this socket's process is being stopped under it: a suspend committed
        and closed the socket, and its client has not seen the close yet."""
        if self.ws_connection is not None and not self.ws_connection.is_closing():
            return False
        ckpt = self.ckpt
        return ckpt.kernel_manager.is_suspended(self.kernel_id) or (
            ckpt.lifecycles.restore_under_way(self.kernel_id)
            and not ckpt.lifecycles.holds_sockets(self.kernel_id)
        )

    def _diverted(self) -> SuspendedConnection:
        """A connection of this socket's session to the suspended kernel, for what the
        client sent before it saw the close: it goes to the restored kernel, and the
        replies wait for the client's reconnect (the socket is closing)."""
        diverted = self._ckpt_diverted
        if diverted is None:
            diverted = self._ckpt_diverted = SuspendedConnection(
                parent=None,
                websocket_handler=self,
                kernel_id=self.kernel_id,
                manager=self.ckpt,
                config=self.config,
            )
            diverted.session.session = self.connection.session.session
            diverted._closed = True
        return diverted
