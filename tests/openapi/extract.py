"""Cut OpenAI's published OpenAPI document down to what this service answers.

The full ``openapi.json`` of openai/openai-openapi is 3.4 MB; the pinned copy beside this
script keeps only the paths the service serves (``PATHS``) and the components those
paths reach, byte-for-byte as published otherwise. To re-pin (a newer commit), run::

    git --git-dir=<clone>/.git show <commit>:openapi.json > /tmp/openapi.json
    python tests/openapi/extract.py /tmp/openapi.json <commit>

and review the conformance test's failures: each is a fix or an entry in DEVIATIONS.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATHS = ("/audio/speech", "/models", "/models/{model}", "/files", "/files/{file_id}",
         "/files/{file_id}/content", "/batches", "/batches/{batch_id}",
         "/batches/{batch_id}/cancel", "/videos", "/videos/{video_id}",
         "/videos/{video_id}/content", "/videos/{video_id}/remix", "/videos/edits",
         "/videos/extensions", "/videos/characters", "/videos/characters/{character_id}")
PREFIX = "#/components/"


def refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def extract(doc: dict, commit: str) -> dict:
    paths = {p: doc["paths"][p] for p in PATHS}
    wanted, todo = set(), refs(paths)
    while todo:
        ref = todo.pop()
        if ref in wanted:
            continue
        wanted.add(ref)
        section, name = ref[len(PREFIX):].split("/", 1)
        todo |= refs(doc["components"][section][name])
    components: dict[str, dict] = {}
    for ref in sorted(wanted):
        section, name = ref[len(PREFIX):].split("/", 1)
        components.setdefault(section, {})[name] = doc["components"][section][name]
    return {"openapi": doc["openapi"], "info": {
        **doc["info"], "x-source": f"github.com/openai/openai-openapi openapi.json at {commit}",
        "x-license": "MIT, Copyright (c) OpenAI (see LICENSE beside this file)",
        "x-extracted-by": "tests/openapi/extract.py"}, "paths": paths,
        "components": components}


def main() -> None:
    source, commit = sys.argv[1], sys.argv[2]
    out = extract(json.loads(Path(source).read_text()), commit)
    target = HERE / f"openai-openapi-{commit[:7]}.json"
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{target.name}: {len(out['paths'])} paths, "
          f"{sum(len(v) for v in out['components'].values())} components")


if __name__ == "__main__":
    main()
