"""The package's layer rule, checked on the code: every import (module level or inside a function)
of every module against the table in shardstream/README.md, no cycle between subpackages and
facades, and a README line for every file of every subpackage, of the package and of tests/."""

from __future__ import annotations

import ast
import pathlib
import re
from collections import defaultdict
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import shardstream
from needs import needs_torch

ROOT = pathlib.Path(shardstream.__file__).parent
README = (ROOT / "README.md").read_text()
SUBPACKAGES = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("_") and p.name != "__pycache__")
FACADES = sorted(p.stem for p in ROOT.glob("*.py"))


def rule_table() -> Dict[str, Set[str]]:
    """The 'may import' table of the package README: {layer: layers it may import}."""
    section = README[README.index("## The import rule"):]
    rules = {}
    for line in section.splitlines():
        m = re.match(r"\| `(_\w+)` \|(.*)\|\s*$", line)
        if m:
            rules[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    return rules


def group_of(module: str) -> str:
    """'shardstream._fetch.http' -> '_fetch'; 'shardstream.compat' -> 'compat'; 'shardstream' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> Iterator[Tuple[str, str, str, int]]:
    """(importing group, imported group, file, line) for every import of the package by itself."""
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if rel.name == "__init__" else module.rpartition(".")[0]
        source = group_of(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                names = [f"{target}.{a.name}" for a in node.names] if target == "shardstream" else [target]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "shardstream" or name.startswith("shardstream."):
                    target_group = group_of(name)
                    if target_group != source:
                        yield source, target_group, str(path.relative_to(ROOT)), node.lineno


def test_the_rule_table_names_every_subpackage():
    assert sorted(rule_table()) == SUBPACKAGES


def broken_imports(rules: Dict[str, Set[str]]) -> List[str]:
    """Every import in the package that `rules` (source layer -> layers it may import) forbids."""
    return [
        f"{file}:{line}: {source} imports {target}"
        for source, target, file, line in imports()
        if source in rules and target not in rules[source]
        or source in FACADES and target in ("_cli", "_prep") and source not in ("cli", "__main__")
    ]


def test_every_import_follows_the_rule():
    broken = broken_imports(rule_table())
    assert broken == [], "\n".join(broken)


def test_no_cycle_between_subpackages_and_facades():
    graph: Dict[str, Set[str]] = defaultdict(set)
    for source, target, _, _ in imports():
        graph[source].add(target)
    state: Dict[str, int] = {}

    def visit(node: str, path: Tuple[str, ...]) -> None:
        if state.get(node) == 1:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(node):] + (node,)))
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph[node]):
            visit(nxt, path + (node,))
        state[node] = 2

    for node in sorted(graph):
        visit(node, ())


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_every_file_has_a_readme_line(subpackage):
    folder = ROOT / subpackage
    readme = (folder / "README.md").read_text()
    missing = [p.name for p in folder.glob("*.py") if p.name != "__init__.py" and f"`{p.name}`" not in readme]
    assert missing == []
    assert f"`{subpackage}/`" in README  # and the package README lists the subpackage


@needs_torch
def test_the_package_and_tests_readmes_name_every_file():
    """shardstream/README.md has a line for every top-level module, tests/README.md for every file
    of tests/ (the subpackages' READMEs are checked above)."""
    assert [name for name in FACADES if f"`{name}.py`" not in README] == []
    tests = pathlib.Path(__file__).parent
    listing = (tests / "README.md").read_text()
    assert [p.name for p in tests.glob("*.py") if p.name != "__init__.py" and f"`{p.name}`" not in listing] == []


def test_the_checker_sees_a_broken_rule():
    """The rule table is what the checker enforces: forbidding an import that exists fails."""
    rules = rule_table()
    assert broken_imports(rules) == []
    rules["_shard"].discard("_tar")  # _shard reads members with the tar reader
    broken = broken_imports(rules)
    assert broken and all(": _shard imports _tar" in line for line in broken)
