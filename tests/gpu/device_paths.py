"""Which lines a script prints differently on a GPU machine, read from its code paths.

The notebook lane (test_gpu.py) runs every notebook on the GPUs and compares what each launched
script prints with the stored CPU output. A few lines differ by design: text printed in a branch
on the backend or device (``if dist.get_backend() == "gloo": ... else: "skipped on nccl"``), text
built from a value chosen there (``amp_dtype = float16 if device.type == "cuda" else ...``), the
message of an exception caught around a call that the build decides (a hook that refuses on a CPU
build), and numbers computed from data drawn with the device's own generator
(``torch.randn(..., device=device)``: CUDA's generator draws other numbers than the CPU's).

``device_dependent_templates(source)`` finds them in a script's source, without running it: the
strings such code builds, as regular expressions (the formatted values as ``.*``). The lane's
allow-list must cover every stored line one of them matches, so that a new device branch fails
the lane's guard here, on a CPU, instead of the lane on its first GPU run.

The reading is deliberately simple: names are followed within one function (and through the
functions whose return value depends on the device), not through attributes or containers.
"""

import ast
import re

# A test on the backend or the device: the two sides of such a branch print different things.
DEVICE_TEST = re.compile(r"\b(nccl|gloo|cuda|is_cuda)\b|device\.type|get_backend\(|\bbackend\b")
# torch's random factories: with device= on a GPU they use CUDA's generator.
RANDOM_FACTORIES = {"randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial"}
# The choice itself (which backend, which device): every script prints it as "backend=... device=...",
# which tests/sanitize.cfg masks, and a tensor on either device computes the same numbers.
CHOICE = {"backend", "device", "device_type", "device_id", "device_ids", "local_rank"}
# Literal text shorter than this says too little to find a line by (a template of "nccl" would).
MIN_LITERAL = 10


def _is_device_test(node: ast.AST) -> bool:
    return bool(DEVICE_TEST.search(ast.unparse(node)))


def _draws_on_device(call: ast.Call) -> bool:
    """torch.randn(..., device=d) with d not the literal "cpu"."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name not in RANDOM_FACTORIES:
        return False
    for keyword in call.keywords:
        if keyword.arg == "device":
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value == "cpu")
    return False


def _called_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


class _Scope:
    """One function (or the module's body), read in order: the names whose values depend on the
    device, the strings built from them, whether it returns such a value, and the functions it
    passes such values to."""

    def __init__(self, functions: set[str], params: set[str], keyword_choices: set[int]):
        self.functions, self.keyword_choices = functions, keyword_choices
        self.names: set[str] = set(params)
        self.returns_tainted = False
        self.strings: list[ast.AST] = []
        self.calls: list[tuple[str, ast.Call]] = []

    def tainted(self, node: ast.AST | None) -> bool:
        if node is None:
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in self.names:
                return True
            # device_ids=[...] if device.type == "cuda" else None: the choice, not a result.
            if isinstance(sub, ast.IfExp) and _is_device_test(sub.test) and id(sub) not in self.keyword_choices:
                return True
            if isinstance(sub, ast.Call) and (_draws_on_device(sub) or _called_name(sub) in self.functions):
                return True
        return False

    def note_calls(self, node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                self.calls.append((_called_name(sub), sub))

    def strings_in(self, node: ast.AST, branch: bool) -> None:
        """The strings built in node: all of them in a device branch, else those with a tainted value."""
        parts = {id(v) for sub in ast.walk(node) if isinstance(sub, ast.JoinedStr) for v in sub.values}
        for sub in ast.walk(node):
            if isinstance(sub, ast.JoinedStr):
                if branch or any(self.tainted(v.value) for v in sub.values if isinstance(v, ast.FormattedValue)):
                    self.strings.append(sub)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and branch and id(sub) not in parts:
                self.strings.append(sub)

    def assign(self, targets: list[ast.AST], tainted: bool) -> None:
        """Names bound to a device-dependent value join the set; rebound to another, they leave it."""
        for target in targets:
            names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} - CHOICE
            if tainted:
                self.names |= names
            elif isinstance(target, ast.Name):
                self.names -= names

    def visit(self, statements: list[ast.stmt], branch: bool) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue  # a scope of its own
            if isinstance(stmt, ast.If):
                self.strings_in(stmt.test, branch)
                self.note_calls(stmt.test)
                inside = branch or _is_device_test(stmt.test)
                self.visit(stmt.body, inside)
                self.visit(stmt.orelse, inside)
                continue
            if isinstance(stmt, ast.Try):
                # The build decides whether a call on the device raises: what the handler makes differs.
                decided = any(_is_device_test(s) or "device" in ast.unparse(s) for s in stmt.body)
                self.visit(stmt.body, branch)
                for handler in stmt.handlers:
                    self.visit(handler.body, branch or decided)
                self.visit(stmt.orelse, branch)
                self.visit(stmt.finalbody, branch)
                continue
            # The statement's own expressions, before the names it binds change.
            for field, value in ast.iter_fields(stmt):
                if field not in ("body", "orelse", "finalbody", "handlers"):
                    for node in value if isinstance(value, list) else [value]:
                        if isinstance(node, ast.AST):
                            self.strings_in(node, branch)
                            self.note_calls(node)
            value = getattr(stmt, "value", None)
            if isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                self.assign(targets, branch or self.tainted(value))
            elif isinstance(stmt, ast.AugAssign) and (branch or self.tainted(value)):
                self.assign([stmt.target], True)
            elif isinstance(stmt, ast.For | ast.AsyncFor):
                self.assign([stmt.target], branch or self.tainted(stmt.iter))
            elif isinstance(stmt, ast.With | ast.AsyncWith):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        self.assign([item.optional_vars], branch or self.tainted(item.context_expr))
            elif isinstance(stmt, ast.Return) and (branch or self.tainted(stmt.value)):
                self.returns_tainted = True
            # Nested blocks (loops, with) keep the branch they are in.
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(block, list):
                    self.visit(block, branch)


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _parameters_reached(call: ast.Call, function: ast.FunctionDef, scope: _Scope) -> set[str]:
    """The parameters of function that a call passes a device-dependent value to."""
    names = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if isinstance(call.func, ast.Attribute) and names[:1] == ["self"]:
        names = names[1:]
    reached = {names[k] for k, arg in enumerate(call.args) if k < len(names) and scope.tainted(arg)}
    return reached | {kw.arg for kw in call.keywords if kw.arg and scope.tainted(kw.value)}


def templates_of(node: ast.AST) -> list[str]:
    """Regular expressions for the lines a string expression makes: the literal parts escaped, each
    formatted value ``.*``; lines with too little literal text to find them by are left out."""
    parts = [node] if isinstance(node, ast.Constant) else node.values
    lines, line, literal = [], [], 0
    for part in parts:
        if not isinstance(part, ast.Constant):
            if not line or line[-1] != ".*":
                line.append(".*")
            continue
        for k, piece in enumerate(str(part.value).split("\n")):
            if k:  # a new line starts
                lines.append(("".join(line), literal))
                line, literal = [], 0
            line.append(re.escape(piece))
            literal += len(piece.strip())
    lines.append(("".join(line), literal))
    return [text for text, literal in lines if literal >= MIN_LITERAL]


def device_dependent_templates(source: str) -> list[str]:
    """Regular expressions for the lines a script builds differently on a GPU machine (re.search
    finds them in its output)."""
    tree = ast.parse(source)
    functions = _functions(tree)
    keyword_choices = {
        id(kw.value) for kw in ast.walk(tree) if isinstance(kw, ast.keyword) and kw.arg and "device" in kw.arg
    }
    tainted_functions: set[str] = set()
    params: dict[str, set[str]] = {}
    while True:  # until no function's result or parameters are found to depend on the device
        strings, before = [], (set(tainted_functions), {k: set(v) for k, v in params.items()})
        for name, body in [("<module>", tree.body), *((f.name, f.body) for f in functions.values())]:
            scope = _Scope(tainted_functions, params.get(name, set()), keyword_choices)
            for _ in range(2):  # a loop's names, used before the statement that binds them
                scope.visit(body, False)
            if scope.returns_tainted:
                tainted_functions.add(name)
            for called, call in scope.calls:
                if called in functions:
                    params.setdefault(called, set()).update(_parameters_reached(call, functions[called], scope))
            strings += scope.strings
        if (tainted_functions, params) == before:
            break
    templates = []
    for node in strings:
        templates += [t for t in templates_of(node) if t not in templates]
    return templates
