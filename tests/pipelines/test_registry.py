"""Registry, model resolution, request contracts and the import rules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import InvalidRequest, ModelNotFound
from core.jobs import JobKind
from core.settings import DEFAULT_ALIASES
from pipelines import (
    Pipeline,
    PipelineSpec,
    SpeechRequest,
    import_pipeline_modules,
    register_pipeline,
    resolve_model,
)

ROOT = Path(__file__).resolve().parents[2]

import_pipeline_modules()


def test_duplicate_pipeline_names_are_rejected():
    spec = PipelineSpec(name="piper-joe", kind=JobKind.SPEECH, models=("other",))
    with pytest.raises(ValueError, match="already registered"):
        register_pipeline(type("Impostor", (Pipeline,), {"spec": spec}))


def test_models_resolve_by_id_name_and_alias():
    assert resolve_model("tts-1", ["piper-joe"], DEFAULT_ALIASES).name == "piper-joe"
    assert resolve_model("piper/en_US-joe-medium", ["piper-joe"], {}).name == "piper-joe"
    with pytest.raises(ModelNotFound) as err:
        resolve_model("m" * 100, ["piper-joe"], {})
    assert "m" * 33 not in err.value.message
    with pytest.raises(ModelNotFound):  # registered but not enabled
        resolve_model("piper-joe", [], {})


@pytest.mark.parametrize(("request_fields", "param"), [
    ({"input": "x" * 5000}, "input"),
    ({"input": "hi", "voice": "nobody"}, "voice"),
    ({"input": "hi", "instructions": "be cheerful"}, "instructions"),
    ({"input": "hi", "ref_text": "copy me"}, "ref_text"),
])
def test_piper_contract_rejections(request_fields, param):
    spec = resolve_model("piper-joe", ["piper-joe"], {})
    with pytest.raises(InvalidRequest) as err:
        spec.validate_speech(SpeechRequest.from_dict(request_fields))
    assert err.value.param == param


def test_piper_accepts_openai_voices_and_default():
    spec = resolve_model("piper-joe", ["piper-joe"], {})
    for voice in ("alloy", "Nova", "default", None, ""):
        spec.validate_speech(SpeechRequest(input="hi", voice=voice))


def test_api_and_pipeline_specs_import_without_heavy_libraries():
    code = ("import sys, pipelines as p; p.import_pipeline_modules();"
            "import api.app, omnijobs.cli;"
            "heavy = {'torch', 'vllm', 'vllm_omni', 'onnxruntime', 'piper'} & set(sys.modules);"
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


ALLOWED = {
    "core": set(),
    "media": {"core"},
    "storage": {"core"},
    "migrations": {"storage"},
    "pipelines": {"media", "core"},
    "api": {"storage", "pipelines", "core"},
    "tasks": {"pipelines", "media", "storage", "core"},
    "omnijobs": {"api", "tasks", "pipelines", "media", "storage", "core"},
}
PACKAGES = set(ALLOWED)


def _our_imports(path: Path) -> set[str]:
    """Our top-level packages that a module imports (relative imports resolved)."""
    module = list(path.relative_to(ROOT).with_suffix("").parts)
    base = module[:-1]  # the package a relative import starts from
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                rest = node.module.split(".") if node.module else []
                target = base[:len(base) - node.level + 1] + rest
            else:
                target = (node.module or "").split(".")
            names = [target] if node.module else [target + [a.name] for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        else:
            continue
        found |= {n[0] for n in names if n}
    return (found & PACKAGES) - {module[0]}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    bad = {}
    for path in (ROOT / package).rglob("*.py"):
        extra = _our_imports(path) - ALLOWED[package]
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad, bad


def test_nothing_but_the_cli_imports_api_or_tasks():
    for package in PACKAGES - {"api", "tasks", "omnijobs"}:
        for path in (ROOT / package).rglob("*.py"):
            assert not _our_imports(path) & {"api", "tasks", "omnijobs"}, path


def test_the_entry_point_package_holds_only_the_entry_point():
    """The console script and its command groups (one ``*_cli.py`` module each, with the
    options they share and the worker's supervisor with its wait for released GPUs), how
    it talks to a person (console.py and startup.py, which import only core), the batch
    client with the ``omnijobs dev`` it finds in its folder (an HTTP client: it imports
    nothing of ours) and the operator's usage report (it reads the usage repository, as the admin
    commands read theirs); no service code."""
    helpers = {"__init__.py", "cli.py", "console.py", "local.py", "startup.py",
               "options.py", "supervisor.py", "released.py"}
    names = {p.name for p in (ROOT / "omnijobs").glob("*.py")}
    assert {"batch_cli.py", "usage_cli.py", "worker_cli.py", "serve_cli.py"} <= names
    assert not {n for n in names - helpers if not n.endswith("_cli.py")}
    assert _our_imports(ROOT / "omnijobs" / "console.py") <= {"core"}
    assert _our_imports(ROOT / "omnijobs" / "startup.py") <= {"core"}
    assert not _our_imports(ROOT / "omnijobs" / "batch_cli.py")
    assert not _our_imports(ROOT / "omnijobs" / "local.py")
    assert not _our_imports(ROOT / "omnijobs" / "released.py")  # the supervisor's: light
    assert _our_imports(ROOT / "omnijobs" / "usage_cli.py") <= {"storage"}
    assert not [p for p in (ROOT / "omnijobs").iterdir() if p.is_dir()
                and p.name != "__pycache__"]


def test_refusals_name_the_model_the_caller_used():
    from pipelines import VideoRequest, get_spec

    h3 = get_spec("minimax-h3")
    clip = VideoRequest(prompt="A lighthouse.", seconds=5, width=1280, height=720, fps=12)
    with pytest.raises(InvalidRequest) as err:
        h3.validate_video(clip, "house-video")
    assert err.value.message.startswith("'house-video' (served here by minimax-h3: ")
    with pytest.raises(InvalidRequest) as err:
        h3.validate_video(clip)
    assert err.value.message == "'MiniMaxAI/MiniMax-H3' renders at 24 fps only"
    piper = get_spec("piper-joe")
    with pytest.raises(InvalidRequest) as err:
        piper.validate_speech(SpeechRequest(input="hi", instructions="Whisper."), "tts-1")
    assert "'tts-1' (served here by piper-joe: Piper VITS" in err.value.message
