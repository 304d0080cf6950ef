"""The extension's type stub (_ferry.pyi) is generated from the built module by nanobind's
stubgen (python/CMakeLists.txt) and ships beside it: the installed stub and the module must name
the same classes, functions, methods and parameters."""
import ast
import os
import pathlib
import re

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)
import ferry._ferry as ext


def stub():
    path = pathlib.Path(ext.__file__).with_name("_ferry.pyi")
    assert path.is_file(), f"{path}: no type stub beside the extension module"
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def public(names):
    return {n for n in names if not n.startswith("_")}


def names_in(body):
    """The names a stub's module or class body defines."""
    out = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
    return public(out)


def stub_params(fn):
    a = fn.args
    out = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    out += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return tuple(out)


def signature_params(text):
    """Parameter names of a nanobind signature, 'def f(a: T, *, b: U = \\0) -> R'."""
    depth, parts, token = 0, [], ""
    for c in text[text.index("(") + 1:]:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        if c == "," and depth == 0:
            parts.append(token)
            token = ""
        else:
            token += c
    parts.append(token)
    names = (re.split(r"[:=]", p, maxsplit=1)[0].strip() for p in parts)
    return tuple(n for n in names if n and n not in ("*", "/"))


def mismatched_signatures(owner, body, label):
    """Functions whose overloads in the stub take other parameters than the module's."""
    stubbed = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            stubbed.setdefault(node.name, set()).add(stub_params(node))
    bad = []
    for name, params in stubbed.items():
        signatures = getattr(vars(owner).get(name), "__nb_signature__", None)
        if signatures is None:  # a property or a plain attribute: its name is checked
            continue
        actual = {signature_params(text) for text, *_ in signatures}
        if actual != params:
            bad.append(f"{label}{name}: module {sorted(actual)}, stub {sorted(params)}")
    return bad


def test_stub_names_what_the_module_defines():
    tree = stub()
    assert names_in(tree.body) == public(vars(ext))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            assert names_in(node.body) == public(vars(getattr(ext, node.name))), node.name


def test_stub_signatures_match_the_module():
    tree = stub()
    bad = mismatched_signatures(ext, tree.body, "")
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bad += mismatched_signatures(getattr(ext, node.name), node.body, node.name + ".")
    assert not bad, "\n".join(bad)


def test_signature_params_reads_nanobind_signatures():
    text = "def f(self, a: ndarray[dtype=uint8, shape=(*)], *, b: dict[str, int] = \\0, **kw) -> R"
    assert signature_params(text) == ("self", "a", "b", "**kw")
