"""The documentation under docs/: it builds without a warning, its REST reference matches
the server's routes, and every command and configuration snippet in it runs or loads.

Each fenced block names its kind: ``text`` is an output sample; ``ipython`` is a notebook
cell (run in a real kernel), ``python`` a config file (loaded with traitlets and checked
against the real classes) or ``cell.py`` (run against a real server), ``yaml`` a Zero to
JupyterHub config (its Python parts loaded the same way), ``json`` node facts (loaded),
``bash`` commands (run, or checked against what they name). A block of another kind, or a
command no check knows, fails the test: a new snippet needs a check.
"""

from __future__ import annotations

import importlib
import json
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from docs_snippets import DOCS, blocks_of, commands, doc_blocks
from harness import Kernel, Paths
from traitlets.config import Config, Configurable

from jupyter_ckpt import compat

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CHECKED = {"bash", "python", "ipython", "yaml", "json"}
SAMPLES = {"text"}
CONFIGURABLES = {
    "SuspendPolicy": "jupyter_ckpt_server.policy:SuspendPolicy",
    "ImageStore": "jupyter_ckpt.store:ImageStore",
    "CkptManager": "jupyter_ckpt_server.manager:CkptManager",
    "ServerApp": "jupyter_server.serverapp:ServerApp",
    "IdentityProvider": "jupyter_server.auth.identity:IdentityProvider",
    "JupyterHub": "jupyterhub.app:JupyterHub",
    "Spawner": "jupyterhub.spawner:Spawner",
    "LocalProcessSpawner": "jupyterhub.spawner:LocalProcessSpawner",
    "KubeSpawner": "kubespawner:KubeSpawner",
    "IdleCuller": "jupyterhub_idle_culler:IdleCuller",
}
# our own classes are instantiated with the config, so a bad value fails as it would at start
INSTANTIATED = {"SuspendPolicy", "ImageStore", "CkptManager"}


def load_class(name: str) -> type[Configurable]:
    module, _, attr = CONFIGURABLES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def check_config(config: Config) -> None:
    """Every section is a known class and every key one of its configurable traits."""
    for section, values in config.items():
        assert section in CONFIGURABLES, f"the docs configure {section}, which no check knows"
        cls = load_class(section)
        traits = cls.class_traits(config=True)
        for key in values:
            assert key in traits, f"{section}.{key} is not a configurable trait of {cls}"
        if section in INSTANTIATED:
            cls(config=config)


def load_config(text: str, config: Config | None = None) -> Config:
    """Run a config file as Jupyter's applications do: ``c`` and ``get_config()``."""
    c = config if config is not None else Config()
    exec(compile(text, "<docs snippet>", "exec"), {"c": c, "get_config": lambda: c})
    return c


def test_every_block_says_what_it_is() -> None:
    unknown = [str(b) for b in doc_blocks() if b.lang not in CHECKED | SAMPLES]
    assert not unknown, f"blocks without a known kind ({sorted(CHECKED | SAMPLES)}): {unknown}"


def test_the_docs_build_without_warnings(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (tmp_path / "html" / "configuration.html").read_text()
    for name in ("SuspendPolicy", "ImageStore", "CkptManager"):
        for trait in load_class(name).class_traits(config=True):
            assert f'<span class="pre">{name}.{trait}</span>' in reference, f"{name}.{trait}"
    rest = (tmp_path / "html" / "rest-api.html").read_text()
    for path in API:
        assert f'<span class="pre">{path}</span>' in rest, path


def test_every_computed_default_is_described() -> None:
    """A default read from the environment or a directory shows in the reference only
    through the trait's help."""
    for name in ("SuspendPolicy", "ImageStore", "CkptManager"):
        cls = load_class(name)
        for trait_name, trait in cls.class_traits(config=True).items():
            if trait_name in cls._trait_default_generators:
                assert "Default:" in (trait.help or ""), f"{name}.{trait_name}"


API = yaml.safe_load((DOCS / "rest-api.yaml").read_text())["paths"]


def openapi_routes(spec: dict[str, Any]) -> set[tuple[str, str]]:
    methods = {"get", "put", "post", "patch", "delete"}
    return {
        (re.sub(r"\{\w+\}", "{}", path), method)
        for path, item in spec["paths"].items()
        for method in item
        if method in methods
    }


def server_routes() -> set[tuple[str, str]]:
    from jupyter_ckpt_server.handlers import default_handlers
    from tornado.web import RequestHandler

    routes = set()
    for pattern, handler in default_handlers:
        path = re.sub(r"\(\?P<\w+>[^)]*\)", "{}", pattern)
        for method in ("get", "put", "post", "patch", "delete"):
            if getattr(handler, method) is not getattr(RequestHandler, method):
                routes.add((path, method))
    return routes


def test_the_rest_reference_matches_the_routes() -> None:
    from openapi_spec_validator import validate

    spec = yaml.safe_load((DOCS / "rest-api.yaml").read_text())
    validate(spec)
    documented, served = openapi_routes(spec), server_routes()
    assert served - documented == set(), "routes missing from docs/rest-api.yaml"
    assert documented - served == set(), "docs/rest-api.yaml documents routes the server lacks"


def test_the_config_files_load(tmp_path: Path) -> None:
    """The python blocks other than cell.py, as the server or hub would load them; paths
    under /etc/ point into a temporary directory with a master secret and profiles."""
    etc = tmp_path / "etc"
    (etc / "jupyter-ckpt").mkdir(parents=True)
    (etc / "jupyter-ckpt" / "master").write_text(secrets.token_hex(32))
    (etc / "jupyter-ckpt-nodes").mkdir()
    facts = json.loads(blocks_of("json", "admin-guide.md")[0].text)
    (etc / "jupyter-ckpt-nodes" / "profiles.json").write_text(
        json.dumps({"profiles": {"a10": facts}})
    )
    configs = [b for b in blocks_of("python") if not b.text.startswith('"""cell.py')]
    assert len(configs) >= 4
    for block in configs:
        check_config(load_config(block.text.replace("/etc/", f"{etc}/")))


def test_the_zero_to_jupyterhub_configs_load() -> None:
    known_env = set(re.findall(r"JUPYTER_CKPT_\w+", _sources()))
    for block in blocks_of("yaml"):
        values = yaml.safe_load(block.text)
        hub = values.get("hub", {})
        for name, value in {
            **hub.get("extraEnv", {}),
            **values.get("singleuser", {}).get("extraEnv", {}),
        }.items():
            assert not name.startswith("JUPYTER_CKPT") or name in known_env, name
            assert isinstance(value, str), f"{name}: Kubernetes wants a string"
        for python in hub.get("extraConfig", {}).values():
            # the chart's own config runs first: it defines the culler service
            chart = Config()
            chart.JupyterHub.services = [
                {"name": "jupyterhub-idle-culler", "command": ["python3", "-m", "culler"]}
            ]
            config = load_config(python, chart)
            check_config(config)
            for service in config.JupyterHub.services:
                mounted = [f["mountPath"] for f in hub.get("extraFiles", {}).values()]
                for arg in service["command"][3:]:
                    assert arg.removeprefix("--config=") in mounted, arg
        for extra in hub.get("extraFiles", {}).values():
            check_config(load_config(extra["stringData"]))


def _sources() -> str:
    return "\n".join(
        p.read_text()
        for d in ("jupyter_ckpt", "server_extension")
        for p in (ROOT / d).rglob("*.py")
    )


def test_the_node_facts_load(tmp_path: Path) -> None:
    for block in blocks_of("json"):
        path = tmp_path / "facts.json"
        path.write_text(block.text)
        facts = compat.node_facts(str(path))
        assert facts["gpus"], block


def test_the_notebook_cells_run(start_kernel: Any) -> None:
    """The magics of the user guide and the quickstart's cell, in a real kernel on a
    private store; each magic line runs as its own cell, as a user would try them."""
    kernel: Kernel = start_kernel()
    kernel.run("import numpy as np\nbig_cache = np.zeros(10)\ntmp = 1\nstream = (i for i in [])")
    for block in blocks_of("ipython"):
        lines = block.text.splitlines()
        if lines[0].startswith("%"):
            for line in lines:
                kernel.run(line.split("#")[0])
        else:
            kernel.run(block.text)
    assert kernel.eval("int(a.sum())") == 499999500000


def test_the_command_line_synopsis_runs(start_kernel: Any, ckpt_paths: Paths, tmp_path: Path):
    """`jupyter ckpt` as the user guide lists it, on an image saved by a real kernel:
    ID|NAME is that image, FILE an export of it; rm runs last."""
    start_kernel().run("x = 1\n%ckpt save demo")
    (block,) = [b for b in blocks_of("bash", "user-guide.md") if "jupyter ckpt" in b.text]
    lines = [c for c in commands(block) if c]
    lines.sort(key=lambda words: words[2] == "rm")
    for words in lines:
        assert words[:2] == ["jupyter", "ckpt"], words
        argv = [
            w.replace("ID|NAME", "demo").replace("FILE", str(tmp_path / "demo.tar"))
            for w in words[2:]
        ]
        result = subprocess.run(
            [sys.executable, "-c", "from jupyter_ckpt.cli import main; main()", *argv],
            env=ckpt_paths.env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, f"{words}: {result.stdout}{result.stderr}"


def check_command(words: list[str], pyproject: dict[str, Any], scripts: dict[str, str]) -> None:
    """What a command names exists: extras, npm scripts, files, options, traits."""
    head = words[0].removeprefix(".venv/bin/")
    flags = [w for w in words if re.match(r"--[A-Z]\w*\.\w+", w)]
    for flag in flags:
        name, _, value = flag[2:].partition("=")
        section, trait = name.split(".")
        config = Config(
            {section: {trait: load_class(section).class_traits()[trait].from_string(value)}}
        )
        check_config(config)
    extras = pyproject["project"]["optional-dependencies"]
    if head in ("pip", "python3", "python") and "install" in words:
        for word in words:
            for extra in re.findall(r"\[(\w+)\]", word):
                assert extra in extras, f"{words}: no extra {extra}"
            if word.startswith("torch=="):
                assert word in extras["test"], f"{words}: the test extra pins another torch"
    elif head == "npm":
        if words[1] in ("run", "test"):
            script = words[2] if words[1] == "run" else "test"
            assert script in scripts, f"{words}: no npm script {script}"
        else:
            assert words[1] in ("install", "ci"), words
    elif head in ("python", "python3") and words[1] == "cell.py":
        # the quickstart's script, run by tests/server/test_docs_quickstart.py
        assert any(b.text.startswith('"""cell.py') for b in blocks_of("python")), words
    elif head in ("python", "python3") and words[1].endswith(".py"):
        source = (ROOT / words[1]).read_text()
        for option in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
            assert f'"{option}"' in source, f"{words}: {option} is not an option of {words[1]}"
    elif head in ("python", "python3") and words[1] == "-m":
        assert importlib.util.find_spec(words[2]) is not None or words[2] == "venv", words
    elif head in ("jupyter", "jupyter-lab"):
        assert words[1] in ("lab", "server", "labextension", "ckpt"), words
    elif head == "sphinx-build":
        assert words[-2] == "docs", words
    elif head in ("curl", "until"):
        for path in re.findall(r"/api/ckpt/[^\s?\"']*", " ".join(words)):
            assert any(re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", p), path) for p in API), path
    else:
        # the rest: ruff, pip uninstall, and the quickstart's shell variables (run for real
        # by tests/server/test_docs_quickstart.py)
        assert head in ("ruff", "pip", "export") or "=" in head, words


def test_every_command_names_what_exists() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts = json.loads((ROOT / "package.json").read_text())["scripts"]
    checked = 0
    for block in blocks_of("bash"):
        for words in commands(block):
            if words:
                check_command(words, pyproject, scripts)
                checked += 1
    assert checked > 20
