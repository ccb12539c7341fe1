"""Does the suite notice small, realistic bugs? Apply each mutant below, one at a time, to a
temporary copy of the project, run the test files that should notice it, and print whether
it was killed (a test failed) or survived.

    python tools/mutation_check.py                 # every mutant
    python tools/mutation_check.py --list          # names, files and test files
    python tools/mutation_check.py verify-skipped env-unset-skipped   # some of them

Each mutant replaces one exact snippet; a snippet that no longer occurs exactly once is
reported as stale, never skipped in silence. The unmutated copy runs first: a test file
that fails without any mutant would kill everything and says nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = "server_extension/jupyter_ckpt_server"
ROUNDTRIP = "tests/test_roundtrip.py"
FAILURES = "tests/test_restore_failures.py"
UNITS = "tests/test_units.py"
STORE = "tests/test_store.py"
SECURITY = "tests/test_security.py"
MULTIUSER = "tests/test_store_multiuser.py"
SAFETY = "tests/server/test_server_safety_steps.py"
SUSPEND = "tests/server/test_server_suspend_restore.py"
RACES = "tests/server/test_server_races.py"
MONITOR = "tests/server/test_server_monitor.py"
IDLE_WORK = "tests/server/test_server_idle_work.py"
IDLE_WAITING = "tests/server/test_server_idle_waiting.py"
ENCRYPTION = "tests/test_encryption.py"
AUTOSAVE = "tests/server/test_server_autosave.py"
CRASH = "tests/server/test_server_crash.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    # -- capture and restore ------------------------------------------------------------
    Mutant(
        "capture-drops-aliases",
        "jupyter_ckpt/image/capture.py",
        "        try:\n            nbytes, devices = pickled.stream.add(value)\n",
        "        if any(variables[n] is value for n in names):\n"
        '            record.update(status="saved", bytes=0, devices=[])\n'
        "            continue\n"
        "        try:\n            nbytes, devices = pickled.stream.add(value)\n",
        (ROUNDTRIP,),
    ),
    Mutant(
        "sharing-not-kept",
        "jupyter_ckpt/image/stream.py",
        "        p = self.pickler\n        start, first",
        "        p = self.pickler\n        p.clear_memo()\n        start, first",
        (UNITS, ROUNDTRIP),
    ),
    Mutant(
        "failed-variable-not-rewound",
        "jupyter_ckpt/image/stream.py",
        "        except BaseException:\n            self._rewind(start, first, modules)\n",
        "        except BaseException:\n",
        (UNITS, FAILURES),
    ),
    Mutant(
        "probe-not-loaded",
        "jupyter_ckpt/image/stream.py",
        "                unpickler.load()  # the probe\n",
        "",
        (UNITS, ROUNDTRIP),
    ),
    Mutant(
        "failed-variable-not-poisoned",
        "jupyter_ckpt/image/stream.py",
        "            _poison(unpickler, reader, damage.tainted(i), marker)\n",
        "",
        (UNITS, FAILURES),
    ),
    Mutant(
        "excluded-not-reported",
        "jupyter_ckpt/image/restore.py",
        'if var["status"] in ("lost", "excluded"):',
        'if var["status"] == "lost":',
        (ROUNDTRIP, FAILURES),
    ),
    Mutant(
        "restored-claims-all",
        "jupyter_ckpt/image/restore.py",
        "    report.restored = [n for n in order if n in staged]\n",
        "    report.restored = order\n",
        (ROUNDTRIP, FAILURES),
    ),
    Mutant(
        "groups-applied-one-by-one",
        "jupyter_ckpt/image/restore.py",
        "            staged.update(zip(names, value, strict=True) if len(names) > 1 "
        "else [(names[0], value)])\n",
        "            staged.update(zip(names, value, strict=True) if len(names) > 1 "
        "else [(names[0], value)])\n"
        "            namespace.update(staged)\n",
        (FAILURES,),
    ),
    Mutant(
        "submodules-not-imported",
        "jupyter_ckpt/image/restore.py",
        '    for submodule in record.get("submodules", ()):\n',
        "    for submodule in ():\n",
        (ROUNDTRIP,),
    ),
    Mutant(
        "ipython-filter-widened",
        "jupyter_ckpt/kernel/state.py",
        "            or name in _IPYTHON_UNHIDDEN\n",
        "            or name in _IPYTHON_UNHIDDEN\n"
        "            or name.startswith(('_', 'In', 'Out', 'exit'))\n",
        (ROUNDTRIP,),
    ),
    Mutant(
        "ipython-filter-forgets-exit-code",
        "jupyter_ckpt/kernel/state.py",
        '_IPYTHON_UNHIDDEN = frozenset({"_exit_code"})',
        "_IPYTHON_UNHIDDEN = frozenset()",
        (ROUNDTRIP,),
    ),
    Mutant(
        "env-unset-skipped",
        "jupyter_ckpt/kernel/state.py",
        "        os.environ.pop(key, None)\n",
        "        pass\n",
        (ROUNDTRIP,),
    ),
    Mutant(
        "env-set-skipped",
        "jupyter_ckpt/kernel/state.py",
        '    os.environ.update(env.get("set", {}))\n',
        "",
        (ROUNDTRIP,),
    ),
    Mutant(
        "restored-env-forgotten",
        "jupyter_ckpt/kernel/state.py",
        '    _RESTORED_ENV.update(env.get("set", {}), env.get("unset", []))\n',
        "",
        (ROUNDTRIP,),
    ),
    Mutant(
        "cwd-not-restored",
        "jupyter_ckpt/kernel/state.py",
        "            os.chdir(cwd)\n",
        "            pass\n",
        (ROUNDTRIP,),
    ),
    Mutant(
        "execution-count-not-restored",
        "jupyter_ckpt/kernel/state.py",
        '        shell.execution_count = facts["execution_count"]\n',
        "        pass\n",
        (ROUNDTRIP,),
    ),
    Mutant(
        "history-not-restored",
        "jupyter_ckpt/kernel/state.py",
        "        shell.history_manager.input_hist_raw[:] = raw\n",
        "",
        (ROUNDTRIP,),
    ),
    # -- the store ----------------------------------------------------------------------
    Mutant(
        "chunk-hash-unchecked",
        "jupyter_ckpt/store/encryption.py",
        "        if len(stored) != size or chunk_hash(stored) != digest:\n",
        "        if len(stored) != size:\n",
        (STORE, SECURITY),
    ),
    Mutant(
        "nonce-reused",
        "jupyter_ckpt/store/encryption.py",
        "        nonce = os.urandom(NONCE)\n",
        '        nonce = self.__dict__.setdefault("_nonce", os.urandom(NONCE))\n',
        (ENCRYPTION,),
    ),
    Mutant(
        "signature-unchecked",
        "jupyter_ckpt/store/signing.py",
        "        if not hmac.compare_digest("
        "self._mac(canonical_json(manifest)), str(signature)):\n",
        "        if False:\n",
        (SECURITY,),
    ),
    Mutant(
        "manifest-id-unchecked",
        "jupyter_ckpt/store/space.py",
        '        if manifest.get("id") != image_id:\n',
        "        if False:\n",
        (SECURITY, STORE),
    ),
    Mutant(
        "vanished-chunks-accepted",
        "jupyter_ckpt/store/writer.py",
        "        missing = self.store.missing_chunks(manifest)\n        if missing:\n",
        "        missing = self.store.missing_chunks(manifest)\n        if False:\n",
        (STORE, "tests/test_faults.py"),
    ),
    Mutant(
        "delete-ignores-records",
        "jupyter_ckpt/store/imagestore.py",
        "        holder = self.records.pins().holder(image_id)\n",
        "        holder = None\n",
        (STORE, "tests/test_cli.py"),
    ),
    Mutant(
        "gc-ignores-references",
        "jupyter_ckpt/store/imagestore.py",
        'if path.rsplit("/", 1)[-1] not in referenced and mtime <= cutoff',
        "if mtime <= cutoff",
        (STORE,),
    ),
    Mutant(
        "gc-ignores-grace",
        "jupyter_ckpt/store/imagestore.py",
        "        cutoff = now - grace_seconds\n",
        "        cutoff = now\n",
        (STORE, "tests/test_faults.py"),
    ),
    Mutant(
        "gc-ignores-leases",
        "jupyter_ckpt/store/imagestore.py",
        "        if leases and candidates:\n",
        "        if False:\n",
        (STORE, MULTIUSER),
    ),
    Mutant(
        "gc-ignores-unreadable-manifests",
        "jupyter_ckpt/store/imagestore.py",
        "        if notes:\n            return GcResult(0, 0, notes)\n",
        "",
        (STORE, MULTIUSER),
    ),
    Mutant(
        "chunk-reused-unreadable",
        "jupyter_ckpt/store/backends.py",
        "            os.close(os.open(full, os.O_RDONLY))\n",
        "",
        (MULTIUSER,),
    ),
    # -- the server's suspend path ------------------------------------------------------
    Mutant(
        "verify-skipped",
        f"{SERVER}/lifecycle/checkpoint.py",
        "            await asyncio.to_thread(self.owner.store.verify, image_id)\n"
        "        except StoreError as exc:",
        "            pass\n        except StoreError as exc:",
        (SAFETY,),
    ),
    Mutant(
        "verify-failure-ignored",
        f"{SERVER}/lifecycle/checkpoint.py",
        "            raise SuspendFailed("
        'f"the image failed verification and was removed: {exc}") from exc\n',
        "            self.owner.log.warning('verification: %s', exc)\n",
        (SAFETY,),
    ),
    Mutant(
        "gpu-release-not-awaited",
        f"{SERVER}/lifecycle/suspend.py",
        "        if usage.holds_gpu:\n            release = await rpc.wait_gpu_released(",
        "        if False:\n            release = await rpc.wait_gpu_released(",
        (SAFETY,),
    ),
    Mutant(
        "gpu-release-timeout-silent",
        f"{SERVER}/rpc.py",
        '        log.warning("GPU memory of %s not released after %.0f s", pids, timeout)\n',
        "",
        (SAFETY,),
    ),
    Mutant(
        "control-messages-dropped",
        f"{SERVER}/websocket.py",
        "        self._queue.append(incoming_msg)\n"
        "        if not suspended or waking:\n"
        '            self._start_restore("message")\n',
        "        if not suspended or waking:\n"
        "            self._queue.append(incoming_msg)\n"
        '            self._start_restore("message")\n',
        (SAFETY,),
    ),
    Mutant(
        "restore-not-shared",
        f"{SERVER}/lifecycle/restore.py",
        "        if lc.restore_task is None:\n",
        "        if True:\n",
        (SAFETY,),
    ),
    Mutant(
        "busy-kernel-suspended",
        f"{SERVER}/lifecycle/suspend.py",
        "            if await rpc.busy(kernel_id):\n                raise SuspendFailed(",
        "            if False:\n                raise SuspendFailed(",
        (SUSPEND,),
    ),
    Mutant(
        "unsaveable-keep-ignored",
        f"{SERVER}/lifecycle/suspend.py",
        'if summary["lost"] and owner.policy.on_unsaveable == "keep" and trigger != "shutdown":',
        "if False:",
        (SUSPEND, MONITOR),
    ),
    Mutant(
        "last-abort-check-skipped",
        f"{SERVER}/lifecycle/suspend.py",
        "            # the last checks: no await from here until the process is told to stop\n"
        "            owner.check(lc)\n",
        "            # the last checks: no await from here until the process is told to stop\n",
        (RACES,),
    ),
    Mutant(
        "aborted-record-kept",
        f"{SERVER}/lifecycle/suspend.py",
        "            if recorded:\n",
        "            if False:\n",
        (RACES, SAFETY),
    ),
    Mutant(
        "record-without-sessions",
        f"{SERVER}/lifecycle/suspend.py",
        '                "sessions": await self.sessions.of(kernel_id),\n',
        '                "sessions": [],\n',
        ("tests/server/test_server_records.py", "tests/server/test_server_restart.py"),
    ),
    Mutant(
        "record-without-env",
        f"{SERVER}/lifecycle/records.py",
        '            "env": lc.launch.get("env", {}),\n',
        '            "env": {},\n',
        (SUSPEND, "tests/server/test_server_restart.py"),
    ),
    Mutant(
        "unchanged-ignores-data",
        "jupyter_ckpt/image/identity.py",
        '    "groups",\n    "segments",\n',
        "",  # neither where the bytes are nor how they group: blind to the data
        (STORE, SUSPEND),
    ),
    Mutant(
        "monitor-ignores-busy",
        f"{SERVER}/monitor.py",
        '        if a.execution_state in ("busy", "starting"):\n',
        '        if a.execution_state == "starting":\n',
        (MONITOR,),
    ),
    Mutant(
        "monitor-no-recheck",
        f"{SERVER}/monitor.py",
        "            if not fresh.due:\n                continue\n",
        "",
        (IDLE_WORK,),
    ),
    Mutant(
        "work-does-not-reset-idle-clock",
        f"{SERVER}/monitor.py",
        "        if seen:\n            self._work_seen[a.kernel_id] = now\n",
        "",
        (IDLE_WORK,),
    ),
    Mutant(
        "children-ignored",
        f"{SERVER}/monitor.py",
        '            if "children" in kinds:\n',
        "            if False:\n",
        (IDLE_WORK,),
    ),
    Mutant(
        "threads-not-measured",
        f"{SERVER}/monitor.py",
        "            for load in work.active_threads(before, after, self.manager.policy, since)\n",
        "            for load in []\n",
        (IDLE_WORK,),
    ),
    Mutant(
        "waking-not-work",
        f"{SERVER}/work.py",
        "        if busy or wakes > 0:\n",
        "        if busy:\n",
        (IDLE_WAITING,),
    ),
    Mutant(
        "library-sleepers-count",
        "jupyter_ckpt/kernel/activity.py",
        '    return {"name": name, "user": _user_callable(_entry(thread)), "fixed": True}\n',
        '    return {"name": name, "user": True, "fixed": True}\n',
        (IDLE_WAITING,),
    ),
    Mutant(
        "unsaveable-not-said",
        f"{SERVER}/monitor.py",
        '        if unsaveable and policy.on_unsaveable == "keep":\n',
        "        if False:\n",
        (IDLE_WORK,),
    ),
    # -- autosave and stopping --------------------------------------------------------------
    Mutant(
        "autosave-recorded-before-verify",
        f"{SERVER}/lifecycle/autosave.py",
        '                written = None if summary.get("unchanged") else summary["id"]\n'
        "                try:\n",
        '                written = None if summary.get("unchanged") else summary["id"]\n'
        "                await self.keeper.put(\n"
        '                    lc, await self.keeper.running(lc, summary, "autosave", now_iso())\n'
        "                )\n"
        "                try:\n",
        (AUTOSAVE,),
    ),
    Mutant(
        "stop-drops-running-records",
        f"{SERVER}/app.py",
        "                await self.autosaver.stop()\n",
        "                await self.autosaver.stop()\n"
        "                for kernel_id in self.manager.kernel_manager.running_ids():\n"
        "                    self.manager.records.delete(kernel_id)\n",
        (CRASH,),
    ),
]


def copy_project(dest: Path) -> None:
    """The files git tracks or would track (no .venv, node_modules, build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = ROOT / os.fsdecode(raw)
        if source.is_file():
            target = dest / os.fsdecode(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, float, str]:
    """(pytest's exit code or -1 on timeout, seconds, the first test that failed)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(copy), str(copy / "server_extension")]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *tests],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return -1, time.monotonic() - started, ""
    failed = [
        line.split()[1]
        for line in result.stdout.splitlines()
        if line.startswith(("FAILED tests", "ERROR tests"))
    ]
    return result.returncode, time.monotonic() - started, failed[0] if failed else ""


def check_imports(copy: Path) -> None:
    """The tests must import the copy, not an installed jupyter_ckpt."""
    env = {**os.environ, "PYTHONPATH": f"{copy}{os.pathsep}{copy / 'server_extension'}"}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import jupyter_ckpt, jupyter_ckpt_server; "
            "print(jupyter_ckpt.__file__); print(jupyter_ckpt_server.__file__)",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = [p for p in where if not Path(p).is_relative_to(copy)]
    if outside:
        sys.exit(f"the copy is not what gets imported: {outside}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per test run")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            print(f"{m.name:34} {m.path:42} {' '.join(m.tests)}")
        return 0

    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy = Path(tmp) / "project"
        copy_project(copy)
        check_imports(copy)
        for test in sorted({t for m in chosen for t in m.tests}):
            code, seconds, _ = run_tests(copy, (test,), args.timeout)
            if code != 0:
                print(f"baseline FAILS ({code}) for {test}: fix that first")
                return 2
            print(f"baseline passes: {test} ({seconds:.0f} s)", flush=True)
        for m in chosen:
            target = copy / m.path
            original = target.read_text()
            if original.count(m.old) != 1:
                results[m.name] = "stale"
                print(f"{m.name:34} STALE (snippet found {original.count(m.old)} times)")
                continue
            target.write_text(original.replace(m.old, m.new))
            try:
                code, seconds, failed = run_tests(copy, m.tests, args.timeout)
            finally:
                target.write_text(original)
            verdict = "killed" if code != 0 else "SURVIVED"
            if code == -1:
                verdict = "killed (timeout)"
            results[m.name] = verdict
            print(
                f"{m.name:34} {verdict:17} {seconds:4.0f} s  {failed or ' '.join(m.tests)}",
                flush=True,
            )

    killed = sum(v.startswith("killed") for v in results.values())
    print(f"\n{killed}/{len(results)} mutants killed")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
