"""Read constants, helpers and stage topologies from the installed vllm-omni's own source.

vllm-omni's package ``__init__`` imports torch, which CPU test installs lack, so the
modules the fake engine needs are read without being imported: module-level constants
are evaluated from their source, pure functions are compiled on their own (their
module's imports left out, their dependencies handed in), the deploy yamls are loaded as
data, and ``vllm_omni/errors.py`` (stdlib only) is loaded from its file.
"""

from __future__ import annotations
import __future__

import ast
import copy
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_spec = importlib.util.find_spec("vllm_omni")
if _spec is None or not _spec.submodule_search_locations:
    raise ImportError("vllm-omni is not installed (the Makefile installs it without deps)")
ROOT = Path(_spec.submodule_search_locations[0])


@functools.cache
def _tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text(), filename=str(ROOT / rel))


def _eval(node: ast.expr, rel: str, namespace: dict[str, Any]) -> Any:
    code = compile(ast.Expression(node), str(ROOT / rel), "eval")
    return eval(code, {"__builtins__": {}}, namespace)  # noqa: S307 - the package's own source


def constants(rel: str) -> dict[str, Any]:
    """Every module-level ``NAME = <expression of literals and earlier names>``."""
    values: dict[str, Any] = {}
    for node in _tree(rel).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            try:
                values[node.targets[0].id] = _eval(node.value, rel, dict(values))
            except Exception:  # calls, imports: not a plain constant
                continue
    return values


def function(rel: str, name: str, **namespace: Any) -> Any:
    """A module-level function compiled alone; local imports inside it are dropped, so
    whatever they bound must come in ``namespace``."""
    node = next(n for n in _tree(rel).body if isinstance(n, ast.FunctionDef) and n.name == name)
    node = ast.fix_missing_locations(_DropImports().visit(copy.deepcopy(node)))
    code = compile(ast.Module(body=[node], type_ignores=[]), str(ROOT / rel), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    scope = dict(namespace)
    exec(code, scope)  # noqa: S102 - the package's own source
    return scope[name]


def defaults(rel: str, cls: str, method: str = "__init__") -> dict[str, Any]:
    """The literal default of each keyword of ``cls.method``."""
    node = next(n for n in _tree(rel).body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == method)
    args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):] + fn.args.kwonlyargs
    values = fn.args.defaults + fn.args.kw_defaults
    return {a.arg: ast.literal_eval(v) for a, v in zip(args, values, strict=True)
            if v is not None}


class _DropImports(ast.NodeTransformer):
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return None

    def visit_Import(self, node: ast.Import) -> None:
        return None


@dataclass(frozen=True)
class Stage:
    """One ``StagePipelineConfig`` of a pipeline topology, as far as the fake needs it."""

    model_stage: str
    execution_type: str  # LLM_AR, LLM_GENERATION, DIFFUSION
    constraints: dict[str, Any]
    subdirs: tuple[str, ...]  # model_subdir and tokenizer_subdir: joined onto the model


def pipelines(rel: str) -> dict[str, list[Stage]]:
    """``PipelineConfig(model_type=..., stages=(StagePipelineConfig(model_stage=...,
    execution_type=StageExecutionType.X, sampling_constraints=..., model_subdir=...), ...))``
    -> {model_type: [Stage]}."""
    consts = constants(rel)
    found: dict[str, list[Stage]] = {}
    for call in ast.walk(_tree(rel)):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "PipelineConfig"):
            continue
        kw = {k.arg: k.value for k in call.keywords}
        stages = []
        for stage in kw["stages"].elts:
            skw = {k.arg: k.value for k in stage.keywords}
            constraints = skw.get("sampling_constraints")
            subdirs = tuple(_eval(skw[k], rel, consts) for k in ("model_subdir", "tokenizer_subdir")
                            if k in skw)
            stages.append(Stage(_eval(skw["model_stage"], rel, consts),
                                skw["execution_type"].attr,
                                _eval(constraints, rel, consts) if constraints else {},
                                tuple(dict.fromkeys(d for d in subdirs if d))))
        found[_eval(kw["model_type"], rel, consts)] = stages
    return found


def annotations(rel: str, cls: str) -> set[str]:
    """The annotated field names of a module-level class (a TypedDict or dataclass)."""
    node = next(n for n in _tree(rel).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.target.id for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def deploy(name: str) -> dict[str, Any]:
    """A shipped deploy yaml (``vllm_omni/deploy/<name>``) as data."""
    return yaml.safe_load((ROOT / "deploy" / name).read_text())


@functools.cache
def errors_module() -> Any:
    """``vllm_omni/errors.py`` (imports nothing but the standard library)."""
    file_spec = importlib.util.spec_from_file_location("_omni_errors", ROOT / "errors.py")
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module
