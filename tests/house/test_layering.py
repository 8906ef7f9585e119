"""The layering stays honest: worker/'s import graph has no cycles (type-only imports and
subpackages included), no folder imports upward or sideways, no Redis command outside the
storage package, every script has one caller, modules, functions and Lua scripts stay small,
only the wiring module and the command line decide anything by role, only the codec names the
fields of arq's records, only the arq-interop module may import arq, the longest import chain
stays short, and a duty kind is named in few production files."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "worker"
#: The wiring table, the command line (the package), and where the role setting is defined.
ROLE_AWARE = {"runtime.roles", "cli", "settings"}


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
        if any(name == r or name.startswith(r + ".") for r in ROLE_AWARE):  # a package: all of it
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


def test_contrib_is_imported_by_nothing_and_django_only_there() -> None:
    """``worker.contrib`` (the integrations) is opt-in: no other module imports it, and Django
    is imported by ``contrib/django/`` alone, so ``worker`` runs without Django installed."""
    graph = graph_of(modules())
    users = {a for a, targets in graph.items() if not a.startswith("contrib")}
    found = {a for a in users if any(b.startswith("contrib") for b in graph[a])}
    assert not found, f"modules importing worker.contrib: {sorted(found)}"
    django = {
        name
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            n == "django" or n.startswith(("django.", "django_tasks"))
            for n in (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if node.level == 0
                else []
            )
        )
    }
    assert django and all(name.startswith("contrib.django") for name in django), django


def test_the_arq_import_finder_finds_them() -> None:
    tree = ast.parse(
        "import arq\nfrom arq.jobs import Job\nimport arq.worker as w\n"
        "def f():\n    from arq import cron\n"
        "import arquebus\nfrom worker import arqcompat\nfrom . import arq\n"
    )
    assert arq_imports(tree) == [1, 2, 3, 5]


def test_the_codec_and_the_retry_requests_need_nothing_but_the_standard_library() -> None:
    """The wire format and the retry requests import the standard library only (no Redis
    client, no arq, no settings): a producer or tool can take them as they are."""
    import sys

    for name in (CODEC, "core.retry"):
        for node in ast.walk(modules()[name]):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            bad = [r for r in roots if r not in sys.stdlib_module_names and r != "__future__"]
            assert not bad, f"worker.{name} imports {bad}"


# -- the wings: bottom to top ----------------------------------------------------------------

#: Every module of worker/ belongs to one wing; a wing imports from itself and from lower wings
#: only, and wings of one floor (the engine: the consumer and the duties) know none of each
#: other. Folders are wings; the top level is the public face, in two floors: what the engine
#: uses (the client, the job context, settings) and what is built on the engine (the app).
WINGS: dict[str, int] = {
    "core": 0,  # time, ids, codecs, schedules, lifecycle, metrics: no Redis, no settings
    "storage": 1,  # the Redis protocol: every command and script
    "leadership": 2,  # who leads: elect, renew, fence
    "face": 3,  # the lower public face: what user code and the engine hold
    "outbox": 3,  # enqueue in the app's database transaction: the outbox's rows and SQL
    "consumer": 4,  # runs jobs
    "duties": 4,  # the singleton duties and every process's background duties
    "surface": 5,  # the upper public face: the app definition and what is built on it
    "runtime": 6,  # one worker process: the role table, lifecycle, health, embedded server
    # integrations with other frameworks (Django's tasks), built on the public surface; nothing
    # in the package imports them
    "contrib": 6,
    "ops": 7,  # the operator side: read model, actions, status, doctor
    "web": 8,  # the console
    "cli": 9,  # the command line
}
#: The top level, by floor. A module at the top in neither fails the wing test.
FACE = {"client", "context", "settings", "sync", "progress", "tracing", "bulk", "polls", "version"}
SURFACE = {"app", "manifest", "sync_client", "testing", "demo", "arqcompat"}
#: Only re-export and start: above every wing.
ENTRY = {"__init__", "__main__"}
#: The top level keeps only the public face.
MAX_TOP_LEVEL = 17


def wing_of(module: str) -> str | None:
    head = module.split(".")[0]
    if "." in module or head in WINGS:
        return head if head in WINGS else None
    if head in FACE:
        return "face"
    if head in SURFACE:
        return "surface"
    return None


def wing_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in graph.items():
        wa = wing_of(a)
        if wa is None:
            bad.append(f"{a} is in no wing")
            continue
        for b in targets:
            wb = wing_of(b)
            if wb is None or wa == wb:
                continue
            if WINGS[wb] >= WINGS[wa]:
                bad.append(f"{a} ({wa}) -> {b} ({wb})")
    return sorted(bad)


def test_every_module_is_in_a_wing_and_imports_only_down() -> None:
    mods = {m: t for m, t in modules().items() if m not in ENTRY}
    assert wing_violations(graph_of(mods)) == []


def test_the_wing_checker_finds_upward_sideways_and_homeless_modules() -> None:
    graph = {
        "storage.jobs": {"consumer.fetch", "core.clock"},
        "duties.poller": {"consumer"},
        "consumer": {"runtime.roles"},
        "client": {"app"},
        "scratch": set(),
    }
    assert wing_violations(graph) == [
        "client (face) -> app (surface)",
        "consumer (consumer) -> runtime.roles (runtime)",
        "duties.poller (duties) -> consumer (consumer)",
        "scratch is in no wing",
        "storage.jobs (storage) -> consumer.fetch (consumer)",
    ]


def test_the_top_level_is_only_the_public_face() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    assert set(top) <= FACE | SURFACE | ENTRY, set(top) - FACE - SURFACE - ENTRY


def test_storage_imports_only_storage_and_core() -> None:
    graph = graph_of(modules())
    bad = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if wing_of(a) == "storage"
        for b in targets
        if wing_of(b) not in ("storage", "core")
    )
    assert bad == []


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest import chain (the graph has no cycles)."""
    memo: dict[str, list[str]] = {}

    def walk(n: str) -> list[str]:
        if n not in memo:
            memo[n] = [n, *max((walk(m) for m in graph.get(n, ())), key=len, default=[])]
        return memo[n]

    return max((walk(n) for n in graph), key=len, default=[])


#: The longest import chain: a deep chain is a layer that does too much (package re-exports
#: and layers within a wing lengthen it).
MAX_CHAIN = 18


def test_the_longest_import_chain_is_short() -> None:
    chain = longest_chain(graph_of(modules()))
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_no_base_name_is_shared_by_more_than_two_modules() -> None:
    names: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.stem != "__init__":
            names.setdefault(p.stem, []).append(str(p.relative_to(PACKAGE)))
    assert {n: ps for n, ps in names.items() if len(ps) > 2} == {}


# -- duty kinds: the operator side learns them from the kinds --------------------------------

#: A duty kind (``periodic``, ``poller``: the ``<kind>`` of a duty's ``<kind>:<name>``) is named
#: in at most this many production files: its own modules, its storage part, its registration
#: (``app.py``, ``roles.py``, ``manifest.py``) and the list of kinds; the snapshot, ``status``,
#: the doctor, the actions, the CLI and the console iterate over ``worker.duties.kinds.KINDS``.
MAX_KIND_FILES = 8
#: Kinds named in more files today, kind -> files: none (the console draws each kind's table
#: from its ``Kind.columns``; what still names a kind: its public API (``app.periodic``,
#: ``client.poller``, ``ctx.poller``), the metrics' labels, the job ids, the keys).
KIND_FILES_PENDING: dict[str, int] = {}


def code_text(path: Path) -> str:
    """What a production file says in code: a Python module without its docstrings and
    comments (prose about a kind names no kind), a script or page as it is."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return source
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.add((value.lineno, value.col_offset))
    return " ".join(
        t.string
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type != tokenize.COMMENT and not (t.type == tokenize.STRING and t.start in docstrings)
    )


def files_naming(kind: str, texts: dict[str, str]) -> list[str]:
    """The files whose code names ``kind`` as a word (``"poller:" + name``; ``app.pollers``
    does not: another word; nor does a module path such as ``worker.duties.outbox``, which
    names a module, not the kind)."""
    word = re.compile(rf"(?<![.\w])(?<!\. ){re.escape(kind)}\b")
    return sorted(f for f, text in texts.items() if word.search(text))


def production_texts() -> dict[str, str]:
    return {
        str(p.relative_to(PACKAGE)): code_text(p)
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in (".py", ".js", ".html")
    }


def test_no_duty_kind_is_named_in_more_than_8_production_files() -> None:
    from worker.duties import kinds

    texts = production_texts()
    found = {k.name: files_naming(k.name, texts) for k in kinds.KINDS}
    grown = {
        k: f"{len(files)} files: {files}"
        for k, files in found.items()
        if len(files) > max(MAX_KIND_FILES, KIND_FILES_PENDING.get(k, 0))
    }
    assert not grown, (
        "duty kinds named in more production files than allowed (describe the kind once, in "
        f"its worker.core.dutykinds.Kind, and iterate worker.duties.kinds.KINDS): {grown}"
    )


def test_the_kind_name_finder_finds_them(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""The poller\'s view."""\n'
        "# a poller\n"
        "def f(app):\n"
        '    """Each poller."""\n'
        '    return [f"poller:{n}" for n in app.pollers]\n'
        "def g(app):\n"
        "    return app.pollers\n"
    )
    page = tmp_path / "p.js"
    page.write_text('pauseButtons("poller", p.name);\n')
    texts = {"m.py": code_text(module), "p.js": code_text(page), "n.py": "pollers = 1"}
    assert files_naming("poller", texts) == ["m.py", "p.js"]
    assert "Each poller" not in texts["m.py"] and "a poller" not in texts["m.py"]
    many = {f"f{i}.py": "kind = 'poller'" for i in range(MAX_KIND_FILES + 1)}
    assert len(files_naming("poller", many)) > MAX_KIND_FILES


def reach_throughs(tree: ast.Module) -> list[int]:
    """Lines reaching through a fenced store to the unfenced one (``x.store.store.y``)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "store"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "store"
    )


#: Reach-throughs still in place, module -> count: none (keep it so: a fenced duty receives
#: the store it reads and the fenced store it writes side by side).
REACH_THROUGH_PENDING: dict[str, int] = {}


def test_no_reach_through_the_fence() -> None:
    found = {
        name: len(lines) for name, tree in modules().items() if (lines := reach_throughs(tree))
    }
    grown = {m: n for m, n in found.items() if n > REACH_THROUGH_PENDING.get(m, 0)}
    assert grown == {}


def test_the_reach_through_finder_finds_them() -> None:
    tree = ast.parse("async def f(self):\n    await self.store.store.get()\n    self.store.get()\n")
    assert reach_throughs(tree) == [2]


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


#: The longest a Lua script or fragment may be, in source lines: a longer one is composed of
#: named fragments, one per concern, beside their caller (as ``FINISH`` and ``CLAIM`` are).
MAX_LUA_LINES = 100
#: What marks a string as Lua.
LUA = re.compile(r"redis\.(call|pcall|error_reply)\b|\blocal\s|\bend\b")


def long_lua(tree: ast.Module, limit: int) -> list[str]:
    """Module-level string constants holding Lua (a whole script or a fragment of one) over
    ``limit`` lines of source: a composed script counts its own lines, not its fragments'."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            texts = [
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if isinstance(target, ast.Name) and LUA.search("\n".join(texts)) and lines > limit:
                out.append(f"{target.id}:{node.lineno} ({lines} lines)")
    return out


def test_no_lua_script_or_fragment_is_over_100_lines() -> None:
    offenders = {
        name: found
        for name, tree in modules().items()
        if name == STORAGE or name.startswith(STORAGE + ".")
        if (found := long_lua(tree, MAX_LUA_LINES))
    }
    assert offenders == {}, f"compose these of fragments, one per concern: {offenders}"


def test_the_long_lua_finder_finds_them() -> None:
    body = "\n".join(f"redis.call('INCR', KEYS[{i}])" for i in range(100))
    source = (
        f'LONG = """\n{body}\n"""\n'  # 102 lines
        f'PART = """\nlocal n = 1\n"""\nWHOLE = (\n    PART\n    + """\nreturn n\n"""\n)\n'
        f'TEXT = """\n{body.replace("redis.call", "a line of prose")}\n"""\n'  # not Lua
    )
    assert long_lua(ast.parse(source), 100) == ["LONG:1 (102 lines)"]
    assert long_lua(ast.parse(source), 102) == []
