"""The layering stays honest: worker/'s import graph has no cycles (type-only imports and
subpackages included), no folder imports upward or sideways, no Redis command outside the
storage package, every script has one caller, modules and functions stay small, and only the
wiring module and the command line decide anything by role, only the codec names the fields
of arq's records, and only the arq-interop module may import arq."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "worker"
#: The wiring table, the command line (the package), and where the role setting is defined.
ROLE_AWARE = {"roles", "cli", "settings"}


def modules() -> dict[str, ast.Module]:
    """Every module of worker/, subpackages included, by dotted name under ``worker``
    (``storage.keys``; a package's ``__init__`` by the package's name, ``storage``)."""
    out: dict[str, ast.Module] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(p.read_text(), str(p))
    return out


def imports(tree: ast.Module, known: set[str] | None = None) -> set[str]:
    """worker.* modules a module imports, anywhere (inside functions and TYPE_CHECKING too),
    by dotted name under ``worker``; ``from worker.pkg import sub`` names the submodule when
    ``known`` has it (and the package too: Python runs its ``__init__`` first)."""
    known = known or set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "worker":
                out |= {a.name for a in node.names}
            elif node.module.startswith("worker."):
                base = node.module.removeprefix("worker.")
                subs = {f"{base}.{a.name}" for a in node.names} & known
                out |= subs if len(subs) == len(node.names) else subs | {base}
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            out |= {n.removeprefix("worker.") for n in names if n.startswith("worker.")}
    if not known:  # the flat view: top-level modules only
        out = {m.split(".")[0] for m in out}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def graph_of(mods: dict[str, ast.Module]) -> dict[str, set[str]]:
    """The import graph. ``from worker.pkg import sub`` inside ``pkg`` is an edge to ``sub``
    only (the package's ``__init__`` is already running); from outside, to both; a name from
    the package's ``__init__`` itself is an edge to it from anywhere."""
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, tree in mods.items():
        if name in ("__init__", "__main__"):
            continue
        edges = set()
        for m in imports(tree, known):
            # importing a submodule from outside its package runs the package's __init__
            parents = [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
            edges |= {m} | {p for p in parents if not name.startswith(p + ".")}
        graph[name] = {m for m in edges if m in mods and m != name} - {"__init__", "__main__"}
    return graph


def test_the_import_graph_has_no_cycles() -> None:
    # __init__ and __main__ only re-export and start; everything else is a real layer
    graph = graph_of(modules())
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_only_the_wiring_and_the_cli_decide_by_role() -> None:
    offenders = []
    for name, tree in modules().items():
        if name.split(".")[0] in ROLE_AWARE:  # a package: every module of it
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "worker.settings":
                bad = {a.name for a in node.names} & {"ROLES", "Role"}
                if bad:
                    offenders.append(f"{name} imports {sorted(bad)}")
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    if (isinstance(side, ast.Attribute) and side.attr == "role") or (
                        isinstance(side, ast.Name) and side.id == "role"
                    ):
                        offenders.append(f"{name}:{node.lineno} compares a role")
    assert not offenders, offenders


#: The storage package: the only code that sends Redis commands.
STORAGE = "storage"
#: The app's example jobs use the job context's Redis as any app may.
APP_CODE = {"demo"}
#: Redis client methods that send a command, and what a receiver of them is called.
REDIS_METHODS = set(
    [
        "get",
        "set",
        "mget",
        "hget",
        "hset",
        "hgetall",
        "hdel",
        "hvals",
        "hscan",
        "hmget",
        "zadd",
        "zrem",
        "zrange",
        "zrangebyscore",
        "zrevrange",
        "zcard",
        "zcount",
        "zscore",
        "zremrangebyscore",
        "publish",
        "pubsub",
        "pipeline",
        "execute_command",
        "scan",
        "scan_iter",
        "delete",
        "exists",
        "incr",
        "sadd",
        "srem",
        "smembers",
        "scard",
        "lrange",
        "lpush",
        "ltrim",
        "xread",
        "xadd",
        "xrevrange",
        "info",
        "config_get",
        "ping",
        "time",
        "eval",
        "evalsha",
        "script_load",
        "register_script",
        "pttl",
        "expire",
        "pexpire",
        "getrange",
        "flushall",
        "acl_whoami",
        "acl_getuser",
        "subscribe",
        "psubscribe",
    ]
)
REDIS_RECEIVERS = ("redis", "pipe", "pubsub")
#: Redis commands still sent outside worker/storage, module -> calls: none (keep it so).
PENDING: dict[str, int] = {}


def _receiver(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute | ast.Call):
        node = node.value if isinstance(node, ast.Attribute) else node.func
        if isinstance(node, ast.Attribute) and not isinstance(node.value, ast.Call):
            return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def redis_calls(tree: ast.Module) -> list[int]:
    """Lines calling a method on something named like a Redis client or pipeline
    (``redis.get(...)``, ``self.redis.zadd(...)``, ``pipe.hset(...)``, ``redis.pubsub()``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = _receiver(node.func).lower()
            if node.func.attr in REDIS_METHODS and (any(w in owner for w in REDIS_RECEIVERS)):
                out.append(node.lineno)
    return sorted(out)


def test_no_redis_command_outside_the_storage_package() -> None:
    found = {
        name: len(lines)
        for name, tree in modules().items()
        if not (name == STORAGE or name.startswith(STORAGE + ".")) and name not in APP_CODE
        if (lines := redis_calls(tree))
    }
    grown = {m: n for m, n in found.items() if n > PENDING.get(m, 0)}
    assert not grown, f"Redis commands outside worker/storage (move them into it): {grown}"


def test_the_redis_call_finder_finds_calls() -> None:
    tree = ast.parse(
        "async def f(self, redis, r):\n    await self.redis.zadd('k', {})\n"
        "    await redis.get('k')\n    redis.pubsub()\n    d.get('k')\n"
    )
    assert redis_calls(tree) == [2, 3, 4]


def scripts() -> dict[str, str]:
    """Every Lua script of worker/storage: a module-level string constant that calls Redis
    and that no other constant is built from (those are fragments, such as ``FENCE``)."""
    found: dict[str, str] = {}
    fragments: set[str] = set()
    for name, tree in modules().items():
        if not name.startswith(STORAGE + "."):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                text = ast.unparse(node.value)
                if "redis.call" in text or "redis.error_reply" in text:
                    found[node.targets[0].id] = name
                fragments |= {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    return {s: m for s, m in found.items() if s not in fragments}


def test_every_script_is_used_by_exactly_one_function() -> None:
    users: dict[str, set[str]] = {s: set() for s in scripts()}
    for name, tree in modules().items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for n in ast.walk(fn):
                    ref = n.id if isinstance(n, ast.Name) else None
                    if ref in users:
                        users[ref].add(f"{name}.{fn.name}")
    wrong = {s: sorted(u) for s, u in users.items() if len(u) != 1}
    assert users and not wrong, f"scripts not used by exactly one function: {wrong}"


# -- arq's wire format: one codec, and arq imported by the interop module alone ---------------

#: The module that reads and writes arq's job and result records (their field names).
CODEC = "core.codec"
#: Where ``import arq`` may appear (lazily: arq is an extra, ``fenced-worker[arq]``).
ARQ_INTEROP = {"arqcompat"}
#: The records' field names (``"id"`` left out: too common a key to tell a record by).
RECORD_FIELDS = {"t", "f", "a", "k", "et", "s", "r", "st", "ft", "q"}


def _field(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value in RECORD_FIELDS


def record_field_uses(tree: ast.Module) -> list[int]:
    """Lines that name a record's field: a dict literal with two or more of the fields as
    keys (``{"f": fn, "a": args}``), a subscript (``record["f"]``), a lookup
    (``record.get("f")``, ``.pop``, ``.setdefault``), a comparison or membership test
    (``key == "a"``, ``"k" in record``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            hit = sum(_field(k) for k in node.keys) >= 2
        elif isinstance(node, ast.Subscript):
            hit = _field(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            lookup = node.func.attr in ("get", "pop", "setdefault")
            hit = lookup and bool(node.args) and _field(node.args[0])
        elif isinstance(node, ast.Compare):
            hit = any(_field(x) for x in (node.left, *node.comparators))
        else:
            continue
        if hit:
            out.append(node.lineno)
    return sorted(set(out))


def arq_imports(tree: ast.Module) -> list[int]:
    """Lines importing arq (``import arq``, ``import arq.jobs``, ``from arq.x import y``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(n == "arq" or n.startswith("arq.") for n in names):
            out.append(node.lineno)
    return out


def test_only_the_codec_names_the_record_fields() -> None:
    found = {
        name: lines
        for name, tree in modules().items()
        if name != CODEC and (lines := record_field_uses(tree))
    }
    assert not found, f"arq record fields named outside worker/core/codec.py: {found}"


def test_the_record_field_finder_finds_them() -> None:
    tree = ast.parse(
        "def f(record, key, rec):\n"
        "    data = {'t': None, 'f': fn, 'a': [], 'k': {}, 'et': 1}\n"
        "    record['f']\n"
        "    record.get('et')\n"
        "    key == 'a'\n"
        "    'k' in record\n"
        "    {'id': 1, 'name': 'x'}; rec.get('id'); rec['name']; {'f': 1}\n"
    )
    assert record_field_uses(tree) == [2, 3, 4, 5, 6]


def test_arq_is_imported_by_the_interop_module_alone() -> None:
    found = {
        name: lines
        for name, tree in modules().items()
        if name not in ARQ_INTEROP and (lines := arq_imports(tree))
    }
    assert not found, f"arq imported outside {sorted(ARQ_INTEROP)}: {found}"


def test_the_arq_import_finder_finds_them() -> None:
    tree = ast.parse(
        "import arq\nfrom arq.jobs import Job\nimport arq.worker as w\n"
        "def f():\n    from arq import cron\n"
        "import arquebus\nfrom worker import arqcompat\nfrom . import arq\n"
    )
    assert arq_imports(tree) == [1, 2, 3, 5]


def test_the_core_does_no_io_and_reads_no_settings() -> None:
    """worker/core imports the standard library and itself only (no Redis, no settings)."""
    import sys

    for name, tree in modules().items():
        if name != "core" and not name.startswith("core."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
                if roots == ["worker"]:
                    assert (node.module + ".").startswith("worker.core."), (name, node.module)
                    continue
            else:
                continue
            bad = [r for r in roots if r not in sys.stdlib_module_names and r != "__future__"]
            assert not bad, f"worker.{name} imports {bad}"


# -- the folders: bottom to top --------------------------------------------------------------

#: worker/'s folders by layer. A module imports from its own folder and from lower layers
#: only; folders of one layer (the engine: the consumer, the duties, leadership) know none of
#: each other. Top-level modules sit between as they are (settings, clock and ids below
#: storage; wiring and read models above the engine), checked by the rules below.
FOLDERS = {
    "core": -1,
    "storage": 0,
    "consumer": 1,
    "duties": 1,
    "leadership": 1,
    "doctor": 2,
    "web": 3,
    "cli": 4,
}
#: What the storage and the engine must never reach up to: the wiring, the process, the
#: app definition, the read models and the operator surfaces.
ABOVE_THE_ENGINE = {"roles", "runtime", "app", "status", "snapshot", "actions", "admin", "demo"}


def _folder(module: str) -> str:
    return module.split(".")[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in graph.items():
        fa = _folder(a)
        for b in targets:
            fb = _folder(b)
            if fa == fb:
                continue
            sideways_or_up = fa in FOLDERS and fb in FOLDERS and FOLDERS[fb] >= FOLDERS[fa]
            reaches_up = FOLDERS.get(fa, 9) <= 1 and fb in ABOVE_THE_ENGINE
            if sideways_or_up or reaches_up:
                bad.append(f"{a} -> {b}")
    return sorted(bad)


def test_no_folder_imports_upward_or_sideways() -> None:
    assert upward_imports(graph_of(modules())) == []


def test_the_upward_import_finder_finds_them() -> None:
    graph = {
        "storage.jobs": {"consumer.fetch"},
        "duties.poller": {"consumer"},
        "consumer": {"roles"},
    }
    assert upward_imports(graph) == [
        "consumer -> roles",
        "duties.poller -> consumer",
        "storage.jobs -> consumer.fetch",
    ]


# -- sizes ------------------------------------------------------------------------------------

MAX_MODULE_LINES = 550
MAX_FUNCTION_LINES = 80
#: modules over 400 lines: at most this many (the rest split by concern)
LARGE_MODULE_LINES, MAX_LARGE_MODULES = 400, 6


def _lines() -> dict[str, int]:
    return {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def long_functions(tree: ast.Module, limit: int) -> list[str]:
    return [
        f"{node.name}:{node.lineno} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_module_is_too_long_and_few_are_long() -> None:
    lines = _lines()
    assert {m: n for m, n in lines.items() if n > MAX_MODULE_LINES} == {}
    large = sorted(m for m, n in lines.items() if n > LARGE_MODULE_LINES)
    assert len(large) <= MAX_LARGE_MODULES, large


def test_no_function_is_over_80_lines() -> None:
    offenders = {
        name: found
        for name, tree in modules().items()
        if (found := long_functions(tree, MAX_FUNCTION_LINES))
    }
    assert offenders == {}


def test_the_long_function_finder_finds_them() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    assert long_functions(ast.parse(f"def f():\n{body}\n"), 80) == ["f:1 (82 lines)"]
    assert long_functions(ast.parse("def g():\n    pass\n"), 80) == []
