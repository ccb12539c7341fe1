"""`jupyter ckpt`: list, show, verify, remove, collect, move and rekey images from a shell.

Built like `jupyter kernelspec`: one JupyterApp per subcommand, so ``ImageStore`` is a
configurable (``--ImageStore.url=...``, ``--store=URL``, config files) exactly as in the
server. Exit codes: 0 success, 1 a runtime error (printed to stderr as one line naming the
cause), 2 bad usage.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
from collections.abc import Generator
from typing import Any, ClassVar, NoReturn

from jupyter_core.application import JupyterApp, base_aliases, base_flags
from traitlets import Bool, Float, TraitError, Unicode, default
from traitlets.config.application import Application
from traitlets.config.loader import ArgumentError, KVArgParseConfigLoader

from . import __version__, compat
from .errors import CkptError
from .format import describe_image, human_bytes, image_summary, list_entries, list_images
from .store import GC_GRACE_SECONDS, ImageStore, check_ref

# What a command may run into at run time; each becomes one line on stderr and exit 1.
RUNTIME_ERRORS = (CkptError, OSError, tarfile.TarError)


class _ArgParser(KVArgParseConfigLoader.parser_class):  # type: ignore[misc,valid-type]
    """Raise instead of printing argparse's multi-line usage, so every usage error looks
    the same (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message)


class _StrictLoader(KVArgParseConfigLoader):
    """A mistyped option (``--grase=0``) is an error here, not a warning that is easy to miss
    while the command goes on with the default."""

    parser_class = _ArgParser

    def _handle_unrecognized_alias(self, arg: str) -> None:
        raise ArgumentError(f"unrecognized option --{arg}")


class CkptBaseApp(JupyterApp):
    """What every `jupyter ckpt` command shares: config, store options and error handling.

    Config files: the store is configured for the server, in ``jupyter_server_config.py``
    or ``.json``, so the command line reads those same files (``config_file_name``) from the
    same Jupyter config path, after ``jupyter_config``, instead of a file of its own that
    would have to repeat ``ImageStore.url`` and could drift from the server's. Command-line
    options still win over files, and ``--config=FILE`` reads one explicit file instead.
    Because the file is the server's, ``--generate-config`` is left out: it would offer to
    overwrite the server's config with only these few options.
    """

    version = __version__
    classes = [ImageStore]
    aliases = {
        **base_aliases,
        "store": (
            "ImageStore.url",
            "Store location: a local path or an fsspec URL (s3://bucket/prefix). When unset: "
            "ImageStore.url from the server's config, else $JUPYTER_CKPT_STORE, else "
            "<jupyter data dir>/ckpt.",
        ),
        "secret-file": (
            "ImageStore.secret_file",
            "The signing secret. When unset: $JUPYTER_CKPT_SECRET_FILE, else "
            "<jupyter data dir>/ckpt-secret. $JUPYTER_CKPT_SECRET (the secret itself, in "
            "hex) is used before any file.",
        ),
        "encryption": (
            "ImageStore.encryption",
            "How new images are stored: none or aes-256-gcm. When unset: "
            "ImageStore.encryption from the server's config, else $JUPYTER_CKPT_ENCRYPTION, "
            "else none.",
        ),
        "user": (
            "ImageStore.user",
            "Whose images (<store>/users/<user>/). When unset: $JUPYTER_CKPT_USER, else "
            "$JUPYTERHUB_USER, else the login name.",
        ),
    }
    flags = {"debug": base_flags["debug"]}
    # Positional arguments, by name for usage lines; checked before anything runs.
    arguments: ClassVar[tuple[str, ...]] = ()

    def _config_file_name_default(self) -> str:
        return "jupyter_server_config"

    def _find_subcommand(self, name: str) -> str:
        """The commands are built in; never exec a `jupyter-ckpt-*` found on PATH instead."""
        return ""

    def _create_loader(self, argv: Any, aliases: Any, flags: Any, classes: Any) -> Any:
        return _StrictLoader(
            argv, aliases, flags, classes=classes, log=self.log, subcommands=self.subcommands
        )

    def parse_command_line(self, argv: Any = None) -> None:
        # Application.parse_command_line turns bad options into exit 1 (via
        # catch_config_error); call the undecorated method so they are usage errors (2).
        decorated = Application.parse_command_line
        parse = getattr(decorated, "__wrapped__", decorated)
        try:
            parse(self, argv)
        except (ArgumentError, TraitError) as exc:
            self.usage_error(str(exc))

    @property
    def usage(self) -> str:
        return " ".join([self.name, *self.arguments, "[options]"])

    def emit_description(self) -> Generator[str, None, None]:
        yield f"Usage: {self.usage}"
        yield ""
        yield from super().emit_description()

    def usage_error(self, message: str) -> NoReturn:
        print(f"{self.name}: {message} (see '{self.name} --help')", file=sys.stderr)
        self.exit(2)
        raise AssertionError("unreachable")  # exit() raises SystemExit

    def fail(self, exc: BaseException) -> NoReturn:
        self.log.debug("%s failed", self.name, exc_info=True)
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{self.name}: {message}", file=sys.stderr)
        self.exit(1)
        raise AssertionError("unreachable")

    def open_store(self) -> ImageStore:
        # An empty url would make the current directory the store (and chmod it 0700).
        url = self.config.get("ImageStore", {}).get("url")
        if url is not None and not str(url).strip():
            raise CkptError("ImageStore.url is empty; give a directory or an fsspec URL")
        # A secret file named on the command line must exist: a typo there would
        # otherwise become a new secret that opens none of the user's images.
        named = self.cli_config.get("ImageStore", {})
        # so must a store named there, for a command that only reads or removes: a typo
        # must not become a new, empty store (and exit 0 listing nothing)
        create_store = self.creates_images or "url" not in named
        try:
            return ImageStore(
                parent=self, create_secret="secret_file" not in named, create_store=create_store
            )
        except TraitError as exc:  # a bad ImageStore value, from a config file or option
            raise CkptError(f"bad store configuration: {exc}") from exc
        except (ImportError, ValueError) as exc:  # fsspec: unknown protocol, missing package
            raise CkptError(f"cannot open the store: {exc}") from exc

    def start(self) -> None:
        args = self.extra_args
        if len(args) != len(self.arguments):
            expected = " ".join(self.arguments) or "no arguments"
            self.usage_error(f"expected {expected}, got {' '.join(args) or 'nothing'}")
        for name, value in zip(self.arguments, args, strict=True):
            if name == "ID":
                try:
                    check_ref(value)
                except CkptError as exc:
                    self.usage_error(str(exc))
        try:
            lines = self.run(self.open_store(), *args)
        except RUNTIME_ERRORS as exc:
            self.fail(exc)
        print("\n".join(lines))

    # whether the command writes new images (a store it names may be a new one)
    creates_images = False

    def run(self, store: ImageStore, *args: str) -> list[str]:
        """Do the command; return the lines to print. Raise a CkptError for the user."""
        raise NotImplementedError


class JsonCommand(CkptBaseApp):
    """A command whose output scripts may want as JSON."""

    json_output = Bool(False, help="Print JSON for scripts instead of text.").tag(config=True)
    flags = {
        **CkptBaseApp.flags,
        "json": ({"JsonCommand": {"json_output": True}}, "Print JSON for scripts."),
    }

    def output(self, data: Any, text: list[str]) -> list[str]:
        return [json.dumps(data, indent=1)] if self.json_output else text


class ListImages(JsonCommand):
    name = "jupyter ckpt list"
    description = "List the images in the store, newest first."
    examples = "jupyter ckpt list\njupyter ckpt list --store=s3://bucket/ckpt --json"

    def run(self, store: ImageStore, *args: str) -> list[str]:
        if self.json_output:
            return self.output(list_entries(store), [])
        return list_images(store)


class ShowImage(JsonCommand):
    name = "jupyter ckpt show"
    description = (
        "Show one image: where it came from, every variable, saved or not, and whether "
        "this node can restore it."
    )
    examples = (
        "jupyter ckpt show 3f2a9c41\njupyter ckpt show my-session --json\n"
        "jupyter ckpt show my-session --node-facts=a10.json   # on a node described so"
    )
    arguments = ("ID",)

    node_facts_file = Unicode(
        help="A JSON file describing the node to check the image against (GpuProbe.node() "
        "format, optionally with 'python' and 'packages'). Default: "
        "$JUPYTER_CKPT_NODE_FACTS, else this node, probed.",
    ).tag(config=True)

    @default("node_facts_file")
    def _default_node_facts_file(self) -> str:
        return os.environ.get(compat.NODE_FACTS_ENV, "")

    aliases = {**JsonCommand.aliases, "node-facts": "ShowImage.node_facts_file"}

    def run(self, store: ImageStore, *args: str) -> list[str]:
        manifest = store.open(args[0])
        result = compat.check(manifest, compat.node_facts(self.node_facts_file or None))
        text = [
            *describe_image(manifest),
            f"  compatibility with this node: {result['verdict']}",
            *(f"    {reason}" for reason in result["reasons"]),
        ]
        return self.output({**image_summary(manifest), "compatibility": result}, text)


class VerifyImage(CkptBaseApp):
    name = "jupyter ckpt verify"
    description = (
        "Check an image's signature and every chunk against its hash. Nothing is unpickled, "
        "so this is safe on an image of unknown origin."
    )
    examples = "jupyter ckpt verify 3f2a9c41"
    arguments = ("ID",)

    def run(self, store: ImageStore, *args: str) -> list[str]:
        manifest = store.verify(args[0])
        chunks = {digest: size for s in manifest["segments"] for digest, size in s["chunks"]}
        return [
            f"OK {manifest['id']} '{manifest['name']}': signature valid, {len(chunks)} chunks "
            f"({human_bytes(sum(chunks.values()))}) in {len(manifest['segments'])} segments "
            f"match their hashes, {len(manifest['variables'])} variables"
        ]


class RemoveImage(CkptBaseApp):
    name = "jupyter ckpt rm"
    description = (
        "Delete an image (also one that fails verification). Its chunks stay until "
        "`jupyter ckpt gc`, as other images may share them."
    )
    examples = "jupyter ckpt rm 3f2a9c41"
    arguments = ("ID",)

    def run(self, store: ImageStore, *args: str) -> list[str]:
        return [f"Deleted image {store.delete(args[0])}"]


class CollectGarbage(CkptBaseApp):
    name = "jupyter ckpt gc"
    description = (
        "Apply the retention rules (ImageStore.retention_days, .max_images, .quota_bytes; "
        "images suspended kernels need are kept), then remove chunks no image references."
    )
    examples = "jupyter ckpt gc\njupyter ckpt gc --grace=0   # no image is being written"

    grace = Float(
        GC_GRACE_SECONDS,
        min=0,
        help="Keep unreferenced chunks younger than this many seconds: an image being "
        "written elsewhere has its chunks stored before its manifest.",
    ).tag(config=True)
    aliases = {**CkptBaseApp.aliases, "grace": "CollectGarbage.grace"}

    def run(self, store: ImageStore, *args: str) -> list[str]:
        result = store.enforce_retention(grace_seconds=self.grace)
        return (
            [f"Removed image {image_id} (retention)" for image_id in result.images]
            + [
                f"Removed {result.files} unreferenced chunk files, freed "
                f"{human_bytes(result.freed)} (kept chunks younger than {self.grace:g} s)"
            ]
            + [f"Note: {note}" for note in result.notes]
        )


class ExportImage(CkptBaseApp):
    name = "jupyter ckpt export"
    description = (
        "Write one verified image (manifest and chunks) to a tar file readable only by "
        "you (0600), to import into another store that uses the same signing secret."
    )
    examples = "jupyter ckpt export my-session session.tar"
    arguments = ("ID", "FILE")

    force = Bool(False, help="Replace FILE if it exists.").tag(config=True)
    flags = {
        **CkptBaseApp.flags,
        "force": ({"ExportImage": {"force": True}}, "Replace FILE if it exists."),
    }

    def run(self, store: ImageStore, *args: str) -> list[str]:
        ref, file = args
        if os.path.lexists(file) and not self.force:
            raise CkptError(f"{file} exists; give --force to replace it")
        return [f"Exported image {store.export(ref, file)} to {file}"]


class ImportImage(CkptBaseApp):
    name = "jupyter ckpt import"
    creates_images = True
    description = (
        "Add an exported image to the store. It must be signed with this store's secret, "
        "and the image appears only once the manifest and every chunk check out."
    )
    examples = "jupyter ckpt import session.tar"
    arguments = ("FILE",)

    def run(self, store: ImageStore, *args: str) -> list[str]:
        return [f"Imported image {store.import_(args[0])} from {args[0]}"]


class RekeyImages(CkptBaseApp):
    name = "jupyter ckpt rekey"
    description = (
        "Rewrite your images and suspended-kernel records under the current secret: "
        "after the secret changed (give the old one with --old-secret-file), or to "
        "encrypt the images written before ImageStore.encryption was switched on. Image "
        "ids stay; old chunks are left to `jupyter ckpt gc`. Encrypted images are never "
        "decrypted back to plaintext."
    )
    examples = (
        "jupyter ckpt rekey --encryption=aes-256-gcm\n"
        "jupyter ckpt rekey --old-secret-file=~/.local/share/jupyter/ckpt-secret.old"
    )

    old_secret_file = Unicode(
        "", help="The previous secret, to read what was written under it (read-only)."
    ).tag(config=True)
    aliases = {**CkptBaseApp.aliases, "old-secret-file": "RekeyImages.old_secret_file"}

    def run(self, store: ImageStore, *args: str) -> list[str]:
        counts = {"rekeyed": 0, "current": 0, "failed": 0}
        for outcome in store.rekey(self.old_secret_file or None):
            counts[outcome.result] += 1
            if outcome.result != "current":  # a long rekey shows its progress
                detail = f" ({outcome.detail})" if outcome.result == "rekeyed" else ""
                problem = f": {outcome.detail}" if outcome.result == "failed" else ""
                verb = "Rekeyed" if outcome.result == "rekeyed" else "Could not rekey"
                print(f"{verb} {outcome.kind} {outcome.ident}{detail}{problem}", flush=True)
        store.follow_store_encryption()  # what every writer of this store now does
        summary = (
            f"{counts['rekeyed']} rewritten, {counts['current']} already current "
            f"(encryption for new images: {store.encryption})"
        )
        if counts["failed"]:
            raise CkptError(f"{counts['failed']} could not be rekeyed (see above); {summary}")
        return [summary]


COMMANDS: tuple[type[CkptBaseApp], ...] = (
    ListImages,
    ShowImage,
    VerifyImage,
    RemoveImage,
    CollectGarbage,
    ExportImage,
    ImportImage,
    RekeyImages,
)


class CkptApp(CkptBaseApp):
    name = "jupyter ckpt"
    description = "Manage the checkpoint images of notebook kernels."
    examples = "jupyter ckpt list\njupyter ckpt show --help"
    arguments = ("COMMAND",)
    subcommands = {
        cls.name.rsplit(" ", 1)[-1]: (cls, cls.description.split(". ")[0].rstrip(".") + ".")
        for cls in COMMANDS
    }

    def start(self) -> None:
        if self.subapp is None:
            given = self.extra_args[0] if self.extra_args else None
            problem = f"unknown command {given!r}" if given else "no command given"
            self.usage_error(f"{problem}; use one of {', '.join(self.subcommands)}")
        self.subapp.start()


def main(argv: list[str] | None = None) -> None:
    """Entry point of `jupyter-ckpt` (which `jupyter ckpt` runs)."""
    CkptApp.launch_instance(argv)


if __name__ == "__main__":
    main()
