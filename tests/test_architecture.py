"""The package's architecture stays as the README's Design section draws it.

Every ``import`` of every module (module level or inside a function) is read with :mod:`ast`; a package
may import only itself and the packages of lower layers (:data:`LAYERS`), so there is no upward import
and no cycle between packages. The cores import no MPI, torch or clock; nothing below the command line
reads an argparse Namespace.
"""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hopdec")

LAYERS = [
    {"hopdec", "hopdec.errors", "hopdec.limits", "hopdec.files", "hopdec.core", "hopdec.launcher", "hopdec.words",
     "hopdec.heterogeneity"},
    {"hopdec.topology", "hopdec.ml", "hopdec.transport", "hopdec.report"},
    {"hopdec.hop", "hopdec.ps", "hopdec.allreduce"},
    {"hopdec.settings", "hopdec.observe"},
    {"hopdec.modes"},
    {"hopdec.runtime"},
    {"hopdec.sim", "hopdec.optim"},
    {"hopdec.cli", "hopdec.__main__"},
    {"hopdec.testbed"},
]
"""Packages from the bottom up: the base modules; the domain libraries (graphs, torch, MPI messages, the
log model); the protocol cores; the settings and the observers; the run assemblies; the MPI runners (and
the loops every executor shares); the simulator and the optimizer; the command line; the network testbed and the simulator's validation
against real runs (they launch ``hopdec train`` and ``hopdec sim``)."""
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
CORES = ("hopdec.hop", "hopdec.ps", "hopdec.allreduce", "hopdec.core")
"""Sans-I/O: no MPI, no torch, no clock."""


def _modules():
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                yield (rel[:-len(".__init__")] if rel.endswith(".__init__") else rel), path


def _imports(module, path):
    """``(imported module, line)`` of every import in the file, relative ones resolved."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, node.lineno
            for a in node.names:                    # ``from hopdec import topology``: a module too
                yield f"{target}.{a.name}", node.lineno


def package(module):
    """The package a module belongs to: ``hopdec.X`` (or a top-level module ``hopdec.x``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


MODULES = dict(_modules())


def _edges():
    out = []
    for module, path in MODULES.items():
        for target, line in _imports(module, path):
            if target.split(".")[0] != "hopdec":
                continue
            if target not in MODULES and target.rsplit(".", 1)[0] in MODULES:
                target = target.rsplit(".", 1)[0]        # ``from hopdec.x import name``: the module x
            if target not in MODULES:
                continue
            a, b = package(module), package(target)
            if a != b:
                out.append((module, line, a, b))
    return out


def test_every_package_has_a_layer():
    missing = sorted({package(m) for m in MODULES} - set(LAYER))
    assert not missing, f"packages without a layer in LAYERS: {missing}"


def test_no_upward_import_between_packages():
    bad = [f"{m}:{line} imports {b} (layer {LAYER[b]}) from layer {LAYER[a]} ({a})"
           for m, line, a, b in _edges() if LAYER[b] > LAYER[a]]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_cycle_between_packages():
    graph = {}
    for _, _, a, b in _edges():
        graph.setdefault(a, set()).add(b)
    state = {}

    def visit(p, path):
        state[p] = "open"
        for q in sorted(graph.get(p, ())):
            if state.get(q) == "open":
                pytest.fail("import cycle: " + " -> ".join(path + [p, q]))
            if q not in state:
                visit(q, path + [p])
        state[p] = "done"
    for p in sorted(graph):
        if p not in state:
            visit(p, [])


def test_the_layer_check_finds_an_upward_import(tmp_path):
    """The test above can fail: a core module importing the MPI runner is an upward import."""
    src = tmp_path / "bad.py"
    src.write_text("def f():\n    from hopdec.runtime.hop_mpi import run\n")
    targets = [t for t, _ in _imports("hopdec.hop.bad", str(src)) if t in MODULES]
    assert targets == ["hopdec.runtime.hop_mpi"]
    assert LAYER[package(targets[0])] > LAYER[package("hopdec.hop.bad")]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(CORES)))
def test_cores_do_no_io(module):
    """The protocol cores: no MPI, no torch, no clock (hopdec.core's contract)."""
    banned = {"mpi4py", "torch", "time", "socket", "os"}
    found = [f"{t} (line {line})" for t, line in _imports(module, MODULES[module]) if t.split(".")[0] in banned]
    assert not found, f"{module} imports {found}"


def test_nothing_below_the_command_line_reads_a_namespace():
    """Settings are typed objects below hopdec.cli: no ``args.`` attribute reads, no argparse (the command
    lines -- hopdec.cli and the testbed's ``python -m hopdec.testbed`` -- are where options are read)."""
    bad = []
    for module, path in MODULES.items():
        if module.startswith("hopdec.cli") or module == "hopdec.testbed.__main__":
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args" \
                    and not (isinstance(node.ctx, ast.Load) and node.attr in ("update", "items", "get")):
                bad.append(f"{module}:{node.lineno} args.{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and node.args \
                    and getattr(node.args[0], "id", None) == "args":
                bad.append(f"{module}:{node.lineno} getattr(args, ...)")
        bad += [f"{module}:{line} imports argparse" for t, line in _imports(module, path) if t == "argparse"]
    assert not bad, "\n".join(bad)


def test_the_simulator_imports_nothing_from_the_command_line():
    assert not [e for e in _edges() if e[2] == "hopdec.sim" and e[3] == "hopdec.cli"]


def test_every_option_lands_in_a_settings_group():
    """Each option of ``hopdec train`` and ``hopdec sim`` is a field of the settings group that holds it
    (what a mode's groups, :data:`hopdec.settings.MODES`, say it reads), or one of the few the command
    line resolves itself."""
    from hopdec.cli import sim, train
    from hopdec.settings import MODES, Cost, RunSettings
    fields = {g: set(getattr(RunSettings(), g).options().values()) for g in
              ("work", "protocol", "ps", "emulation", "observe", "checkpoints", "faults")}
    fields["cost"] = set(Cost.options().values())
    itself = {"-h", "--help", "--mode"}
    for parser in (train.build_parser(), sim.build_parser()):
        for action in parser._actions:
            for flag in action.option_strings:
                if flag in itself or flag == "--workers":          # (-n's long name)
                    continue
                assert any(flag in opts for opts in fields.values()), f"{parser.prog} {flag}: in no group"
    for mode, groups in MODES.items():
        assert set(groups) <= set(fields) and "work" in groups, mode
        assert set(RunSettings(mode=mode).groups) == set(groups)
