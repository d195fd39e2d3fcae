"""The shape of the code, checked: layers that import only downwards, no import cycle, what each
package may import from outside the standard library, and modules and classes of a size one
can read.

The contract lives in one place, LAYERS and THIRD_PARTY below, and each package's docstring
says the same in words (checked too). Imports are read from the source with `ast`, every one of
them: at module level, inside functions, under `if TYPE_CHECKING`, and the dynamic ones
(`importlib.import_module("x")`, `__import__("x")`), whose name must then be written out. Inside
`patroller.core`, CORE_ORDER says which module may import which, as docs/development.md does.
"""

import ast
import os
import re
import sys
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = os.path.join(ROOT, "patroller")

# Top to bottom: a unit may import itself and the units below it, never one above. Each entry
# is a package (and everything in it) or a module.
LAYERS: list[tuple[str, ...]] = [
    ("patroller.__main__",),  # python -m patroller
    ("patroller.main",),  # the entry point: the command line's words, or the daemon
    ("patroller.manual",),  # the whole command line in one parser: help, completion, man page
    ("patroller.app",),  # the daemon: build the services, start and stop
    ("patroller.heap",),  # the cycle collector on the daemon's schedule
    ("patroller.http",),  # the server, handlers, read models, live feed, metrics
    ("patroller.doctor",),  # what the daemon would meet on this host, checked
    ("patroller.services",),  # the one object the handlers and the collector take
    ("patroller.notify",),  # telling people: notices, episodes, delivery through Apprise
    ("patroller.state",),  # the lease book, the audit record, the timer, lifetimes
    ("patroller.identify",),  # who runs a process, who calls the API
    ("patroller.observe",),  # nvidia-smi children, parsers, monitors, statistics
    ("patroller.config",),  # every setting, built once
    ("patroller.core",),  # devices, identities, errors, policy, the lease rules
]
# Units outside the daemon's layers: what each may import of patroller. The client side
# imports nothing of the daemon, so that it runs where only the client is installed.
LEAVES: dict[str, tuple[str, ...]] = {
    "patroller": (),  # __init__: the version
    "patroller.durations": (),  # one duration parser, for the client side and the daemon
    "patroller.hosts": (),  # one reader of host lists, for the client side and the daemon
    "patroller.answers": (),  # another host's answers checked, for both fleet views
    "patroller.safetext": (),  # text others chose, written out safely, for every command
    "patroller.background": (),  # background threads at a lower CPU priority than serving
    "patroller.client": ("patroller.durations",),
    "patroller.cli": (
        "patroller.client",
        "patroller.durations",
        "patroller.hosts",
        "patroller.answers",
        "patroller.safetext",
    ),
    "patroller.simulator": (),  # the fake nvidia-smi: nothing of the daemon it imitates a GPU for
}
# What each unit may import beyond the standard library (and patroller).
THIRD_PARTY: dict[str, set[str]] = {
    "patroller.core": set(),
    "patroller.config": {"tomli"},  # Python 3.10's tomllib
    "patroller.observe": {"tornado", "blinker", "grpc"},
    "patroller.identify": {"tornado", "docker", "cachetools"},
    "patroller.state": {"tornado", "cachetools"},
    "patroller.services": set(),
    "patroller.notify": {"tornado", "cachetools", "apprise"},
    "patroller.http": {"tornado", "prometheus_client", "orjson"},
    "patroller.doctor": {"tornado"},
    "patroller.main": set(),
    "patroller.manual": {"shtab", "argparse_manpage"},
    "patroller.app": {"tornado"},
    "patroller.heap": set(),
    "patroller.__main__": set(),
    "patroller": set(),
    "patroller.durations": set(),
    "patroller.hosts": set(),
    "patroller.answers": set(),
    "patroller.safetext": set(),
    "patroller.background": set(),
    "patroller.client": set(),
    "patroller.cli": {"tomli"},  # Python 3.10's tomllib
    "patroller.simulator": set(),
}
# Inside patroller.core, top to bottom: a module imports only modules of lower ranks (never one
# of its own rank, nor one above). docs/development.md states the same order.
CORE_ORDER: list[tuple[str, ...]] = [
    ("patroller.core", "patroller.core.leases"),  # the packages: they re-export
    ("patroller.core.leases.manager",),  # the callers' commands
    ("patroller.core.leases.observed",),  # what the host tells; every change's end
    ("patroller.core.leases.state", "patroller.core.leases.allocations"),  # queries; schedulers'
    (
        "patroller.core.leases.refusals",
        "patroller.core.leases.trespass",  # why not; telling;
        "patroller.core.leases.withholding",
    ),  # granted to nobody
    ("patroller.core.leases.serving", "patroller.core.leases.limits"),  # who gets what; limits
    ("patroller.core.leases.queue", "patroller.core.leases.sources"),  # waiters; two schedulers
    ("patroller.core.leases.holds",),  # a device's hold, its states, events
    ("patroller.core.leases.tally",),  # who runs on a device, counted
    ("patroller.core.scheduled",),  # what an allocation answers, whoever made it
    ("patroller.core.pods",),  # Kubernetes pods' allocations
    ("patroller.core.jobs",),  # Slurm jobs' allocations
    ("patroller.core.usage",),  # GPU-time in categories, and reports of it
    ("patroller.core.topology",),  # how the GPUs are linked; the best-connected set
    (
        "patroller.core.devices",
        "patroller.core.identity",
        "patroller.core.errors",
        "patroller.core.policy",
        "patroller.core.throttle",
        "patroller.core.text",
        "patroller.core.health",
    ),
]
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300
# Classes allowed more, each with why. Config is every setting, one field and its comment a line
# or two each: "every tuning value lives in Config" makes it as long as there are values, and
# one place to find them all is the point.
CLASS_LINES = {
    "patroller.config.settings.Config": 400,
}
# Modules allowed more, each with why. The client is one file that a training container copies
# and imports alone (docs/api.md; test_client.py and bench/gpucheck copy it so): its calls, its
# record of what this process reserved, the keep-alive thread and Claim cannot become modules
# of their own without breaking that promise. Config's module grows with Config (above).
MODULE_LINES = {
    "patroller.client": 480,
    "patroller.config.settings": 420,
}
# The simulator may be larger: it is a program of its own, imitating every era of nvidia-smi.
SIZE_EXEMPT = ("patroller.simulator",)


def modules() -> dict[str, str]:
    """Every module of the package: dotted name -> path."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


MODULES = modules()


def is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def imports(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the module, relative ones resolved."""
    tree = ast.parse(Path(MODULES[module]).read_text(encoding="utf-8"))
    here = module if is_package(module) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            for alias in node.names:  # `from patroller.x import y` may name the module x.y
                if f"{target}.{alias.name}" in MODULES:
                    found.append((f"{target}.{alias.name}", node.lineno))
        elif isinstance(node, ast.Call) and _dynamic(node.func):
            name = node.args[0] if node.args else None
            assert isinstance(name, ast.Constant) and isinstance(name.value, str), (
                f"{MODULES[module]}:{node.lineno}: a dynamic import of a computed name cannot "
                "be checked; write the module's name out"
            )
            found.append((name.value, node.lineno))
    return found


def _dynamic(func: ast.expr) -> bool:
    """Whether a call is importlib.import_module(...) or __import__(...)."""
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def unit_of(module: str) -> str | None:
    """The layer entry or leaf that a patroller module belongs to."""
    units = [u for layer in LAYERS for u in layer] + list(LEAVES)
    best = None
    for unit in units:
        inside = module == unit or module.startswith(unit + ".")
        if inside and (best is None or len(unit) > len(best)):
            best = unit
    return best


def layer_of(unit: str) -> int | None:
    for depth, layer in enumerate(LAYERS):
        if unit in layer:
            return depth
    return None


def internal(name: str) -> str | None:
    """The patroller module an import names (a name inside a module counts as the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_every_module_belongs_to_a_unit_of_the_contract():
    orphans = [m for m in MODULES if unit_of(m) is None]
    assert not orphans, f"modules in no layer or leaf of tests/test_layout.py: {orphans}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers_and_leaves_stay_apart(module):
    unit = unit_of(module)
    depth = layer_of(unit)
    for name, line in imports(module):
        target = internal(name) if name.startswith("patroller") else None
        if target is None:
            continue
        other = unit_of(target)
        if other == unit or other == "patroller":
            continue
        where = f"{MODULES[module]}:{line} imports {target}"
        if unit in LEAVES:
            assert other in LEAVES[unit], f"{where}: {unit} may import only {LEAVES[unit]}"
        elif other in LEAVES:
            assert other in (
                "patroller.durations",
                "patroller.hosts",
                "patroller.answers",
                "patroller.safetext",
                "patroller.background",
                "patroller.cli",
            ), f"{where}: the daemon does not import {other}"
            # the entry point hands words to the command line; the manual reads its parser
            assert other != "patroller.cli" or module in ("patroller.main", "patroller.manual"), (
                f"{where}: only the entry point hands words to the command line"
            )
        else:
            assert layer_of(other) > depth, f"{where}: {other} is not below {unit}"


def core_rank(module: str) -> int:
    for rank, modules_of in enumerate(CORE_ORDER):
        if module in modules_of:
            return rank
    raise AssertionError(f"{module} has no place in CORE_ORDER of tests/test_layout.py")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if unit_of(m) == "patroller.core"))
def test_inside_core_imports_go_down_its_order(module):
    rank = core_rank(module)
    for name, line in imports(module):
        target = internal(name) if name.startswith("patroller.core") else None
        if target is None or target == module:
            continue
        assert core_rank(target) > rank, (
            f"{MODULES[module]}:{line} imports {target}, which is not below it in CORE_ORDER"
        )


def test_the_checks_see_every_kind_of_import(tmp_path, monkeypatch):
    """A module that imports upwards in a function, dynamically, or by a computed name is
    seen (the checks above are only as good as what imports() finds)."""
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "def f():\n"
        "    from patroller.core.leases import limits\n"
        "    importlib.import_module('patroller.http.views')\n"
        "    __import__('docker')\n"
    )
    monkeypatch.setitem(MODULES, "patroller.core.errors", str(source))
    names = [name for name, _ in imports("patroller.core.errors")]
    assert {"patroller.core.leases.limits", "patroller.http.views", "docker"} <= set(names)
    assert core_rank("patroller.core.leases.limits") < core_rank("patroller.core.errors")
    source.write_text("import importlib\nimportlib.import_module('patroller.' + 'http')\n")
    with pytest.raises(AssertionError, match="computed name"):
        imports("patroller.core.errors")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_third_party_imports_are_the_ones_the_unit_may_use(module):
    allowed = THIRD_PARTY[unit_of(module)]
    for name, line in imports(module):
        top = name.split(".")[0]
        if top == "patroller" or top in sys.stdlib_module_names or top == "__future__":
            continue
        assert top in allowed, (
            f"{MODULES[module]}:{line} imports {name}; {unit_of(module)} "
            f"may use {sorted(allowed) or 'the standard library only'}"
        )


def test_no_import_cycle():
    graph = {
        m: {
            t
            for n, _ in imports(m)
            if n.startswith("patroller")
            for t in [internal(n)]
            if t is not None and t != m
        }
        for m in MODULES
    }
    # A package's __init__ that only re-exports its modules is not a cycle with them.
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(sorted(c)) for c in cycles)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_each_package_says_what_it_owns_and_what_it_may_import():
    for module in MODULES:
        if not is_package(module) or module == "patroller":
            continue
        doc = ast.get_docstring(ast.parse(Path(MODULES[module]).read_text(encoding="utf-8"))) or ""
        assert "Owns:" in doc and "May import:" in doc, (
            f"{MODULES[module]}: the docstring says what the package owns and may import"
        )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith(SIZE_EXEMPT)))
def test_modules_and_classes_are_of_a_size_one_can_read(module):
    text = Path(MODULES[module]).read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MODULE_LINES.get(module, MAX_MODULE_LINES), (
        f"{MODULES[module]} has {lines} lines"
    )
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            most = CLASS_LINES.get(f"{module}.{node.name}", MAX_CLASS_LINES)
            assert size <= most, f"{MODULES[module]}: class {node.name} has {size} lines"


def defined_twice(tree: ast.Module) -> list[str]:
    """Names a module's top level (or a class's body) defines more than once: a second test of
    one name hides the first, which pytest then never runs."""
    found = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        seen: set[str] = set()
        for node in scope.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    found.append(f"{node.name} (line {node.lineno})")
                seen.add(node.name)
    return found


def test_no_test_file_defines_a_name_twice():
    """What pyflakes' F811 guards against, which the lint leaves off in tests/ (a fixture
    imported by name is named again by each test that takes it: pyproject.toml)."""
    assert defined_twice(ast.parse("def test_a(): pass\nasync def test_a(): pass\n")) == [
        "test_a (line 2)"
    ]
    assert defined_twice(
        ast.parse("class T:\n    def test_b(self): pass\n    def test_b(self): pass\n")
    )
    folder = os.path.join(ROOT, "tests")
    twice = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            tree = ast.parse(Path(os.path.join(folder, name)).read_text(encoding="utf-8"))
            if found := defined_twice(tree):
                twice[name] = found
    assert not twice


def test_the_tests_import_their_neighbours_by_module_name():
    """tests/ is no package: pytest puts the folder itself on sys.path, so a test imports
    `helpers`, `kubelet`, ... by name. `from tests.x import` collects under `python -m pytest`
    (the working directory is on sys.path) but not under the plain `pytest` script."""
    folder = os.path.join(ROOT, "tests")
    assert not os.path.exists(os.path.join(folder, "__init__.py")), (
        "tests/__init__.py would put the repository root, not tests/, on sys.path"
    )
    wrong = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(Path(os.path.join(folder, name)).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                named = [node.module or ""]
            else:
                continue
            wrong += [
                f"tests/{name}:{node.lineno} imports {n}"
                for n in named
                if n == "tests" or n.startswith("tests.")
            ]
    assert not wrong, "import a test helper by its module name: " + "; ".join(wrong)


# A number said in seconds, as a formatting writes it: `{x:g} s`, `{x:.1f}s`, `%.0f s`,
# `{} seconds`. Milliseconds are not counted: a latency to a tenth of a millisecond (the access
# log's, the heap's) is a measurement, not a duration said to people in words.
UNIT_SIZES = (60, 3600, 86400)  # split by a minute, an hour or a day: a duration said in units
_SECONDS = r"(?:s|secs?|seconds?|second\(s\))\b"
_AFTER_ANY = re.compile(rf" {_SECONDS}")  # after any value: `{timeout} s`
_AFTER_NUMBER = re.compile(rf" ?{_SECONDS}")  # after a number's format: `{x:.1f}s`
_NUMBER_FORMAT = re.compile(r"[defgEFG%n]$")  # a format spec that writes a number
_TEMPLATE = re.compile(  # %-formats (logging's) and str.format's, in a plain string
    rf"%[-#0 +]*\d*(?:\.\d+)?[deEfFgGiu] ?{_SECONDS}|%s {_SECONDS}"
    rf"|\{{[^{{}}]*\}} {_SECONDS}|\{{[^{{}}]*:[^{{}}]*[defgEFG]\}}{_SECONDS}"
)
# Said in seconds where another helper is at work this round (app/daemon.py, client.py, the
# lease manager): by file, how many; the test fails when one more comes or one goes, so the
# list only shrinks. Each goes through durations.describe when its file is next open.
SECONDS_NOT_YET_DESCRIBED: dict[str, int] = {
    # client.py is the one file users copy alone into a container: it imports nothing of the
    # package, durations.py included, and says its one timeout ("within 30 s") itself
    "patroller/client.py": 1,
}


def _split_by_a_unit(node: ast.AST) -> bool:
    """`x // 3600`, `x % 60`, `divmod(x, 86400)`: a number of seconds cut into units."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
        by = node.right
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        by = node.args[1] if node.func.id == "divmod" and len(node.args) == 2 else None
    else:
        return False
    return isinstance(by, ast.Constant) and by.value in UNIT_SIZES


def seconds_said(source: str) -> list[tuple[int, str]]:
    """Where a module says a number of seconds itself, read from its syntax tree, not its text:
    a value formatted and followed by ` s` or ` seconds` (`f"within {timeout:g} s"`, a
    number's format also by `s`: `{x:.1f}s`), a %- or str.format template that does the same
    (`log.warning("... after %.1f s", ran)`), and `//`, `%` or divmod by a minute, an hour or a
    day. Docstrings, comments and the text around a number (`{n} users`, `{word}s`) are not
    counted: a plural is not a duration."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    skipped: set[int] = set()  # docstrings, and the strings inside an f-string
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skipped.update(id(part) for part in node.values)
            for value, text in pairwise(node.values):
                if not (isinstance(value, ast.FormattedValue) and isinstance(text, ast.Constant)):
                    continue
                spec = value.format_spec
                written = "".join(
                    p.value for p in (spec.values if spec else []) if isinstance(p, ast.Constant)
                )
                after = _AFTER_NUMBER if _NUMBER_FORMAT.search(written) else _AFTER_ANY
                if after.match(str(text.value)):
                    found.append((node.lineno, f"{ast.unparse(value)}{text.value[:8]}"))
        elif _split_by_a_unit(node):
            found.append((node.lineno, ast.unparse(node)))
    found.extend(
        (node.lineno, repr(node.value[:60]))
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skipped
        and _TEMPLATE.search(node.value)
    )
    return sorted(found)


SAID_IN_SECONDS = """
f"no answer in {timeout:g} s: killed"
f"within {self.timeout} s"
f"saved {time.time() - saved:.0f} s ago"
f"took {ran:.2f}s"
f"after {n} seconds"
log.warning("%s: restarting in %.0f s", name, delay)
log.info("%s: waited %s seconds", name, wait)
"every {:g} s".format(every)
hours = left // 3600
days, left = divmod(left, 86400)
minutes = left % 60
"""
NOT_SAID_IN_SECONDS = '''
"""A docstring may say `quiet` s ago, and `%.1f s`."""
f"{n} {word}s"  # a plural
f"{held} device(s), {count} users, {gib:.1f} GiB"
f"{allocation.word}s and {x:.2f} ms"
f"kept {days} days, every {describe(every)}"
log.warning("%d client errors (at most %d per %s)", a, b, describe(c))
"%s" % name
share = used / 3600  # GPU-hours: a quantity, not a duration said in words
'''


def test_the_check_for_seconds_said_sees_each_way_and_no_plural():
    """seconds_said, on code written to be found and on code written not to be."""
    assert [line for line, _ in seconds_said(SAID_IN_SECONDS)] == list(range(2, 13))
    assert seconds_said(NOT_SAID_IN_SECONDS) == []


def test_a_duration_is_formatted_in_one_place_per_language():
    """patroller/durations.py says a duration in Python (daemon and command line alike), and
    patroller/http/web/common.js on the web pages: a second copy would drift from the first."""
    said = {}
    for module, path in MODULES.items():
        if module != "patroller.durations" and not module.startswith(SIZE_EXEMPT):
            said[os.path.relpath(path, ROOT)] = seconds_said(
                Path(path).read_text(encoding="utf-8")
            )
    python = {
        f"{name}:{line}": what
        for name, found in said.items()
        if len(found) != SECONDS_NOT_YET_DESCRIBED.get(name, 0)
        for line, what in found
    }
    assert not python, (
        f"seconds said outside patroller/durations.py (say them with durations.describe): {python}"
    )
    gone = {n: k for n, k in SECONDS_NOT_YET_DESCRIBED.items() if len(said.get(n, ())) != k}
    assert not gone, f"SECONDS_NOT_YET_DESCRIBED counts what is no longer there: {gone}"
    defined = {
        name: len(re.findall(r"\bduration\s*\(seconds\)\s*\{", text))
        for name, text in web_sources(".js").items()
    }
    assert {name: n for name, n in defined.items() if n} == {"common.js": 1}, defined
    from patroller.http.page import web_files

    served = web_files()
    for page, script in (
        ("index.html", "app.js"),
        ("fleet.html", "fleet.js"),
        ("report.html", "report.js"),
    ):
        html = served[page].decode("utf-8")
        assert html.index('src="/web/common.js"') < html.index(f'src="/web/{script}"'), page


def web_sources(ending: str) -> dict[str, str]:
    """The text of each of the pages' files (patroller/http/web) whose name ends so, by name."""
    web = Path(PACKAGE, "http", "web")
    return {
        path.name: path.read_text(encoding="utf-8")
        for path in sorted(web.iterdir())
        if path.name.endswith(ending)
    }


def test_the_pages_share_one_head():
    """The pages' head is written once, in base.html, which each page extends (rendered by
    page.pages when the daemon reads its files): no page writes a head of its own, each page
    served opens with that head, and base.html itself is not served."""
    from patroller.http.page import BASE_PAGE, web_files

    written = web_sources(".html")
    assert [n for n, text in written.items() if re.search(r"<head[\s>]", text)] == [BASE_PAGE], (
        written
    )
    served = web_files()
    assert BASE_PAGE not in served
    heads = {
        name: served[name].decode("utf-8").split("</head>")[0].splitlines()
        for name in written
        if name != BASE_PAGE
    }
    assert len(heads) == 3 and all(
        head[:5]
        == [
            "<!doctype html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
        ]
        and '<link rel="stylesheet" href="/web/style.css">' in head
        and '<script src="/web/common.js" defer></script>' in head
        for head in heads.values()
    ), heads


def test_what_common_js_defines_no_page_script_defines_again():
    """common.js is the one place of what the pages share (h, setAttrs, bar, duration, gib,
    timeOfDay): a page's script takes each from window.Patroller, never writes its own."""
    scripts = web_sources(".js")
    shared = re.findall(r"^  (\w+)\(.*\) \{$", scripts.pop("common.js"), re.MULTILINE)
    assert {"h", "setAttrs", "bar", "duration", "gib", "timeOfDay"} <= set(shared), shared
    again = {
        (script, name)
        for script, text in scripts.items()
        for name in shared
        if re.search(rf"\bfunction\s+{name}\s*\(|\b{name}\s*=\s*(function\b|\()", text)
    }
    assert not again, f"defined again outside common.js: {sorted(again)}"
