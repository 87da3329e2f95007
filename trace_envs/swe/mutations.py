"""Procedural bugs: SWE-smith's modifier families, written on libcst (formatting is kept).

Each family is a small rewrite of one syntax node (docs/design.md, "Target environments"):

=====================  ======================================================================
``change_operator``    an operator becomes another of its family (+/-, * / // %, & | ^, << >>,
                       == !=, < <=, > >=, in / not in, is / is not)
``swap_operands``      ``a - b`` → ``b - a``; ``a < b`` → ``b < a``
``break_chain``        ``a + b + c`` → ``a + c``; ``p and q and r`` → ``p and r``
``change_constant``    an integer literal ±1
``invert_if``          swap an if's branches (or negate its test when it has no else)
``remove_conditional`` drop an ``if`` statement without ``else``
``remove_loop``        drop a ``for`` / ``while`` loop
``remove_assignment``  drop an assignment statement
``remove_wrapper``     replace a ``with`` / ``try`` block by its body
``shuffle_statements`` permute a function's statements
``remove_method``      drop a method from a class
``remove_base``        drop a base class
``shuffle_methods``    permute a class's methods
=====================  ======================================================================

:func:`enumerate_sites` lists every place a family applies (file, family, index, enclosing
function, line); :func:`apply_site` rewrites one. Both walk the tree in the same order, so a
site is addressed by ``(file, family, index)`` and a mutation is a pure function of that address
and the seed — :func:`sample_mutations` picks sites with a numpy Generator.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

import libcst as cst
import numpy as np
from libcst.metadata import MetadataWrapper, PositionProvider

FAMILIES = ("change_operator", "swap_operands", "break_chain", "change_constant", "invert_if", "remove_conditional",
            "remove_loop", "remove_assignment", "remove_wrapper", "shuffle_statements", "remove_method",
            "remove_base", "shuffle_methods")
#: Families whose bug sits inside a function that still exists (localization can name it).
FUNCTION_LEVEL = tuple(f for f in FAMILIES if f not in ("remove_method", "remove_base", "shuffle_methods"))

_OP_FAMILIES = [
    (cst.Add, cst.Subtract),
    (cst.Multiply, cst.FloorDivide, cst.Divide, cst.Modulo),
    (cst.BitAnd, cst.BitOr, cst.BitXor),
    (cst.LeftShift, cst.RightShift),
]
_CMP_SWAP = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.LessThan: cst.LessThanEqual,
             cst.LessThanEqual: cst.LessThan, cst.GreaterThan: cst.GreaterThanEqual,
             cst.GreaterThanEqual: cst.GreaterThan, cst.In: cst.NotIn, cst.NotIn: cst.In, cst.Is: cst.IsNot,
             cst.IsNot: cst.Is}
_NON_COMMUTATIVE = (cst.Subtract, cst.Divide, cst.FloorDivide, cst.Modulo, cst.LeftShift, cst.RightShift, cst.Power)


@dataclass(frozen=True)
class Site:
    """One place a modifier family applies."""

    file: str
    family: str
    index: int
    function: str  # qualified name of the enclosing function (or class for class-level families)
    line: int


@dataclass
class Mutation:
    """A rewritten file: the bug, where it is, and both versions of the file."""

    site: Site
    original: str
    mutated: str

    @property
    def patch(self) -> str:
        """The unified diff that introduces the bug (SWE-smith's ``patch``)."""
        return unified_diff(self.site.file, self.original, self.mutated)

    def to_json(self) -> dict:
        return asdict(self.site)


def unified_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _swap_op(op: cst.BaseBinaryOp, rng: np.random.Generator | None) -> cst.BaseBinaryOp | None:
    for family in _OP_FAMILIES:
        if isinstance(op, family):
            others = [c for c in family if not isinstance(op, c)]
            choice = others[int(rng.integers(len(others)))] if rng is not None else others[0]
            return choice(whitespace_before=op.whitespace_before, whitespace_after=op.whitespace_after)
    return None


class _Walker(cst.CSTTransformer):
    """Counts sites (``target`` is None) or rewrites the ``target`` = (family, index) site."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str, target: tuple[str, int] | None = None, rng: np.random.Generator | None = None):
        super().__init__()
        self.file, self.target, self.rng = file, target, rng
        self.sites: list[Site] = []
        self.counts: dict[str, int] = {f: 0 for f in FAMILIES}
        self.scope: list[tuple[str, str]] = []  # ("class"|"def", name)
        self.applied: Site | None = None

    # ---------------------------------------------------------------- bookkeeping
    def _func(self) -> str | None:
        if not any(kind == "def" for kind, _ in self.scope):
            return None
        return ".".join(name for _, name in self.scope)

    def _hit(self, family: str, node: cst.CSTNode, name: str | None = None) -> bool:
        """Record a site; True if it is the one to rewrite."""
        where = name or self._func()
        if where is None:
            return False
        index = self.counts[family]
        self.counts[family] += 1
        line = self.get_metadata(PositionProvider, node).start.line
        site = Site(self.file, family, index, where, line)
        self.sites.append(site)
        if self.target == (family, index) and self.applied is None:
            self.applied = site
            return True
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.scope.append(("class", node.name.value))
        return True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.scope.append(("def", node.name.value))
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self.scope.pop()
        return updated

    # ---------------------------------------------------------------- expressions
    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation):
        if isinstance(updated.operator, tuple(c for fam in _OP_FAMILIES for c in fam)):
            if self._hit("change_operator", original):
                return updated.with_changes(operator=_swap_op(updated.operator, self.rng))
        if isinstance(updated.operator, _NON_COMMUTATIVE):
            if self._hit("swap_operands", original):
                return updated.with_changes(left=updated.right, right=updated.left)
        if isinstance(updated.left, cst.BinaryOperation):
            if self._hit("break_chain", original):
                return updated.with_changes(left=updated.left.left)
        return updated

    def leave_BooleanOperation(self, original: cst.BooleanOperation, updated: cst.BooleanOperation):
        if isinstance(updated.left, cst.BooleanOperation) and self._hit("break_chain", original):
            return updated.with_changes(left=updated.left.left)
        return updated

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison):
        if len(updated.comparisons) == 1:
            target = updated.comparisons[0]
            swap = _CMP_SWAP.get(type(target.operator))
            if swap is not None and self._hit("change_operator", original):
                op = target.operator
                kwargs = {"whitespace_before": op.whitespace_before, "whitespace_after": op.whitespace_after}
                if hasattr(op, "whitespace_between") or swap in (cst.NotIn, cst.IsNot):
                    kwargs["whitespace_between"] = cst.SimpleWhitespace(" ")
                new_op = swap(**{k: v for k, v in kwargs.items() if k in swap.__dataclass_fields__})
                return updated.with_changes(comparisons=[target.with_changes(operator=new_op)])
            if isinstance(target.operator, (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)):
                if self._hit("swap_operands", original):
                    return updated.with_changes(left=target.comparator,
                                                comparisons=[target.with_changes(comparator=updated.left)])
        return updated

    def leave_Integer(self, original: cst.Integer, updated: cst.Integer):
        try:
            value = int(updated.value, 0)
        except ValueError:
            return updated
        if self._hit("change_constant", original):
            delta = 1 if self.rng is None or self.rng.random() < 0.5 or value == 0 else -1
            return updated.with_changes(value=str(value + delta))
        return updated

    # ---------------------------------------------------------------- statements
    def leave_If(self, original: cst.If, updated: cst.If):
        if isinstance(updated.orelse, cst.Else):
            if self._hit("invert_if", original):
                return updated.with_changes(body=updated.orelse.body,
                                            orelse=updated.orelse.with_changes(body=updated.body))
        elif updated.orelse is None and self._hit("invert_if", original):
            test = cst.UnaryOperation(operator=cst.Not(), expression=cst.ensure_type(
                updated.test, cst.BaseExpression).with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
            return updated.with_changes(test=test)
        return updated

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock):
        body = list(updated.body)
        orig_body = list(original.body)
        new_body: list[cst.BaseStatement] = []
        in_class = bool(self.scope) and self.scope[-1][0] == "class"
        for orig, stmt in zip(orig_body, body):
            family = None
            if isinstance(stmt, cst.If) and stmt.orelse is None:
                family = "remove_conditional"
            elif isinstance(stmt, (cst.For, cst.While)):
                family = "remove_loop"
            elif isinstance(stmt, cst.SimpleStatementLine) and any(
                    isinstance(s, (cst.Assign, cst.AugAssign, cst.AnnAssign)) for s in stmt.body) and not in_class:
                family = "remove_assignment"
            elif isinstance(stmt, (cst.With, cst.Try)):
                family = "remove_wrapper"
            elif isinstance(stmt, cst.FunctionDef) and in_class:
                if self._hit("remove_method", orig, name=".".join(n for _, n in self.scope) + "." + stmt.name.value):
                    continue
                new_body.append(stmt)
                continue
            if family is not None and self._hit(family, orig):
                if family == "remove_wrapper":
                    new_body.extend(stmt.body.body)
                continue
            new_body.append(stmt)
        if not in_class and self._func() is not None and len(new_body) > 1:
            start = 1 if _is_docstring(new_body[0]) else 0
            if len(new_body) - start >= 3 and self._hit("shuffle_statements", original):
                rest = new_body[start:]
                order = self.rng.permutation(len(rest)) if self.rng is not None else list(reversed(range(len(rest))))
                if list(order) == list(range(len(rest))):
                    order = list(reversed(range(len(rest))))
                new_body = new_body[:start] + [rest[int(i)] for i in order]
        if not new_body:
            new_body = [cst.SimpleStatementLine(body=[cst.Pass()])]
        return updated.with_changes(body=new_body)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef):
        name = ".".join(n for _, n in self.scope)
        self.scope.pop()
        if updated.bases and self._hit("remove_base", original, name=name):
            keep = [b for i, b in enumerate(updated.bases) if i != len(updated.bases) - 1]
            if keep:
                keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(bases=keep, lpar=updated.lpar if keep else cst.MaybeSentinel.DEFAULT,
                                        rpar=updated.rpar if keep else cst.MaybeSentinel.DEFAULT)
        body = updated.body
        methods = [i for i, s in enumerate(body.body) if isinstance(s, cst.FunctionDef)] \
            if isinstance(body, cst.IndentedBlock) else []
        if len(methods) >= 2 and self._hit("shuffle_methods", original, name=name):
            stmts = list(body.body)
            order = self.rng.permutation(len(methods)) if self.rng is not None else list(reversed(range(len(methods))))
            moved = [stmts[methods[int(i)]] for i in order]
            for slot, stmt in zip(methods, moved):
                stmts[slot] = stmt
            return updated.with_changes(body=body.with_changes(body=stmts))
        return updated


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, (cst.SimpleString,
                                                                                       cst.ConcatenatedString)))


def enumerate_sites(file: str, source: str) -> list[Site]:
    """Every site of every family in one file, in walk order."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return []
    walker = _Walker(file)
    MetadataWrapper(module, unsafe_skip_copy=True).visit(walker)
    return walker.sites


def apply_site(site: Site, source: str, seed: int = 0, wrapper: MetadataWrapper | None = None) -> Mutation | None:
    """Rewrite ``site`` in ``source``; ``None`` if the result is unchanged or does not compile.

    ``wrapper`` (a ``MetadataWrapper`` of ``source``) may be passed to reuse one parse for many sites.
    """
    rng = np.random.default_rng([seed, FAMILIES.index(site.family), site.index])
    walker = _Walker(site.file, (site.family, site.index), rng)
    wrapper = wrapper or MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    mutated = wrapper.visit(walker).code
    if walker.applied is None or mutated == source:
        return None
    try:
        compile(mutated, site.file, "exec")
    except SyntaxError:
        return None
    return Mutation(walker.applied, source, mutated)


def sample_mutations(files: dict[str, str], seed: int, n: int, families: tuple[str, ...] = FAMILIES,
                     functions: set[str] | None = None) -> list[Mutation]:
    """Up to ``n`` distinct mutations over ``files`` ({path: source}), picked deterministically from ``seed``.

    Families are visited round-robin (in an order drawn from the seed) so that one frequent family
    (constants, say) cannot crowd out the others.
    """
    rng = np.random.default_rng(seed)
    by_family: dict[str, list[Site]] = {f: [] for f in families}
    for path in sorted(files):
        for site in enumerate_sites(path, files[path]):
            if site.family in by_family and (functions is None or site.function in functions):
                by_family[site.family].append(site)
    queues = {f: [sites[int(i)] for i in rng.permutation(len(sites))] for f, sites in by_family.items() if sites}
    order = [f for f in families if f in queues]
    order = [order[int(i)] for i in rng.permutation(len(order))]
    out: list[Mutation] = []
    wrappers: dict[str, MetadataWrapper] = {}
    while len(out) < n and any(queues.values()):
        for family in order:
            if not queues[family] or len(out) >= n:
                continue
            site = queues[family].pop(0)
            if site.file not in wrappers:
                wrappers[site.file] = MetadataWrapper(cst.parse_module(files[site.file]), unsafe_skip_copy=True)
            mutation = apply_site(site, files[site.file], seed, wrappers[site.file])
            if mutation is not None:
                out.append(mutation)
    return out
