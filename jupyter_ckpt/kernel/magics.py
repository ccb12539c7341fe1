"""`%ckpt` magics: save, restore, list, show, rm, exclude, include, status, idle-ok, gpu.

Output is short and human, and always names every variable that was not saved or not
restored, with the reason.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class

from ..errors import CkptError
from ..format import describe_image, human_bytes, list_images
from . import request_gpu, session
from .activity import IDLE_OK, idle_ok


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CkptError(f"{message}\n{self.format_usage().strip()}")


def _split(line: str) -> list[str]:
    """The words of a magic's line, as a shell splits them; a quote left open is the
    user's error, said in one line."""
    try:
        return shlex.split(line)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise CkptError(f"cannot read {line.strip()!r}: {str(exc).lower()}") from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%ckpt", description="Checkpoint this kernel's variables.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    save = sub.add_parser("save", help="write an image of the namespace")
    save.add_argument("name", nargs="?")
    save.add_argument(
        "--verify", action="store_true", help="load the image back: report what would not load"
    )
    restore = sub.add_parser("restore", help="bring an image's variables back")
    restore.add_argument("ref", metavar="NAME|ID")
    restore.add_argument(
        "--map-location", metavar="DEVICE", help="load GPU tensors here instead (e.g. cpu)"
    )
    sub.add_parser("list", help="saved images")
    sub.add_parser("show", help="one image's variables").add_argument("ref", metavar="NAME|ID")
    sub.add_parser("rm", help="delete an image").add_argument("ref", metavar="NAME|ID")
    sub.add_parser("exclude", help="leave variables out of images").add_argument(
        "names", nargs="+", metavar="VAR"
    )
    sub.add_parser("include", help="undo exclude").add_argument("names", nargs="+", metavar="VAR")
    sub.add_parser("status", help="store, exclusions and the last image")
    idle = sub.add_parser(
        "idle-ok", help="background work that does not keep the kernel from being suspended"
    )
    idle.add_argument(
        "names", nargs="*", metavar="NAME", help="a function or thread name, or a pattern"
    )
    idle.add_argument("--undo", action="store_true", help="count their work again")
    gpu = sub.add_parser("gpu", help="wait until the server has GPU memory free for this kernel")
    gpu.add_argument("mib", type=float, metavar="MIB", help="GPU memory needed (MiB)")
    gpu.add_argument("--device", type=int, help="on this GPU (default: the one with most room)")
    return parser


def _not_back(missing: dict[str, str], verb: str, cells: dict[str, int]) -> list[str]:
    """The variables not saved or restored, why, and which cells make them again."""
    if not missing:
        return []
    lines = [f"Not {verb} ({len(missing)}):", *(f"  {n}: {why}" for n, why in missing.items())]
    by_cell: dict[int, list[str]] = {}
    for name in missing:
        if name in cells:
            by_cell.setdefault(cells[name], []).append(name)
    if by_cell:
        cells_names = sorted(by_cell.items())
        again = "; ".join(f"In [{n}] for {', '.join(names)}" for n, names in cells_names)
        lines.append(f"To make them again, re-run {again}")
    return lines


@magics_class
class CkptMagics(Magics):
    @line_magic
    def ckpt(self, line: str) -> None:
        """Checkpoint this kernel's variables. `%ckpt --help` lists the commands."""
        try:
            args = _parser().parse_args(_split(line))
        except SystemExit:  # --help printed the usage
            return
        except CkptError as exc:
            print(f"%ckpt: {exc}")
            return
        try:
            print("\n".join(getattr(self, f"_{args.command.replace('-', '_')}")(args)))
        except (CkptError, OSError) as exc:  # one line: the store errors name what to do
            print(f"%ckpt {args.command}: {exc}")

    def _save(self, args: Any) -> list[str]:
        r = session().save(args.name, verify=args.verify)
        if "error" in r:
            return [f"%ckpt save: {r['error']} (nothing was saved; the variables are unchanged)"]
        if r["unchanged"]:
            return [
                f"Nothing changed since '{r['name']}' ({r['id'][:12]}): no new image written "
                "(give a name to write one anyway)",
                *_not_back(r["lost"], "saved", r.get("cells", {})),
            ]
        verified = r.get("verify_seconds")
        lines = [
            f"Saved {len(r['saved'])} variables as '{r['name']}' ({r['id'][:12]}): "
            f"{human_bytes(r['bytes'])}, {human_bytes(r['written'])} new, {r['seconds']:.2f} s"
            + (f", loaded back in {verified:.2f} s" if verified is not None else "")
        ]
        lines += _not_back(r["lost"], "saved", r.get("cells", {}))
        if r["excluded"]:
            lines.append(f"Excluded: {', '.join(r['excluded'])}")
        lines += [f"Warning: {w}" for w in r["warnings"]]
        return lines

    def _restore(self, args: Any) -> list[str]:
        r = session().restore(args.ref, args.map_location)
        lines = [
            f"Restored {len(r['restored'])} variables from '{r['name']}' ({r['id'][:12]}) "
            f"in {r['seconds']:.2f} s"
        ]
        lines += _not_back(r["missing"], "restored", r.get("cells", {}))
        lines += [f"Warning: {w}" for w in r["warnings"]]
        return lines

    def _list(self, args: Any) -> list[str]:
        return list_images(session().store)

    def _show(self, args: Any) -> list[str]:
        return describe_image(session().store.open(args.ref))

    def _rm(self, args: Any) -> list[str]:
        return [f"Deleted image {session().store.delete(args.ref)}"]

    def _exclude(self, args: Any) -> list[str]:
        s = session()
        s.excluded.update(args.names)
        return [f"Excluded from images: {', '.join(sorted(s.excluded))}"]

    def _include(self, args: Any) -> list[str]:
        s = session()
        s.excluded.difference_update(args.names)
        return [f"Excluded from images: {', '.join(sorted(s.excluded)) or '(none)'}"]

    def _gpu(self, args: Any) -> list[str]:
        device = request_gpu(args.mib, args.device)
        where = "" if device is None else f" on GPU {device}"
        return [f"GPU memory free for this kernel: {args.mib:.0f} MiB{where}"]

    def _status(self, args: Any) -> list[str]:
        s = session()
        return [
            f"Store: {s.store.backend.url}",
            f"Excluded: {', '.join(sorted(s.excluded)) or '(none)'}",
            f"Last image: {s.last_image or '(none)'}",
            f"Not keeping the kernel from a suspend: {', '.join(sorted(IDLE_OK)) or '(none)'}",
            *(f"Damaged on disk since its restore: {n} ({why})" for n, why in s.damaged.items()),
        ]

    def _idle_ok(self, args: Any) -> list[str]:
        marked = idle_ok(*args.names, undo=args.undo)
        if not marked:
            return ["Background work that does not keep the kernel: (none)"]
        return [
            f"Background work that does not keep the kernel: {', '.join(marked)}",
            "(a suspend stops it; the status no longer names it)",
        ]
