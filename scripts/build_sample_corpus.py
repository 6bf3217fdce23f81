"""Build the bundled sample corpus from Python's own documentation.

Sources, all part of CPython and covered by the Python Software Foundation License (PSF-2.0,
code examples in the docs are also 0BSD), which permits redistribution:

1. Docstrings of the standard library (module docstrings with their public functions, and one
   document per public class with its methods), gathered with ``inspect`` from modules that live
   in the interpreter's stdlib directory (so e.g. setuptools' ``distutils`` shim is excluded).
2. The help topics that ``pydoc`` ships in ``pydoc_data.topics``.
3. The reStructuredText sources of the tutorial, HOWTOs, FAQ, glossary and "using"/"extending"
   guides from Debian's ``python3.11-doc`` package (``apt-get install -y python3.11-doc``), cut
   into chunks of about ``RST_CHUNK_CHARS`` at paragraph boundaries.

Skipped: private modules and members (leading underscore), test packages, modules that fail to
import or have side effects on import (GUI toolkits, ``this``, ``antigravity``), docstrings shorter
than ``MIN_DOCSTRING_CHARS``, documents shorter than ``MIN_DOCUMENT_CHARS``, exact duplicates.
Output is one ``{"text": ...}`` JSON object per line in a fixed order (docstrings by module and
member name, then topics by name, then rst chunks by file path), so the result depends only on
the interpreter and the doc package version.

The committed file was generated with CPython 3.11.7 and python3.11-doc 3.11.2-6+deb12u9, from the
repository root, with:

    apt-get install -y python3.11-doc
    python3.11 scripts/build_sample_corpus.py --out torchtitan/assets/sample_corpus.jsonl
"""

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import pkgutil
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

MIN_DOCSTRING_CHARS = 80
MIN_DOCUMENT_CHARS = 200
RST_CHUNK_CHARS = 4000
RST_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
RST_SECTIONS = ("tutorial", "howto", "faq", "glossary.rst.txt", "using", "extending")
SKIPPED_MODULES = {
    "antigravity",  # opens a web browser on import
    "this",  # prints on import
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",  # handled separately as help topics
}
SKIPPED_NAME_PARTS = {"test", "tests", "__main__"}
LITERAL_TYPES = (type(None), bool, int, float, str, bytes)
MAX_DEFAULT_REPR_CHARS = 40


class ElidedDefault:
    """Stands in for a default whose repr varies by run or machine (addresses, environ, paths)."""

    def __repr__(self) -> str:
        return "..."


def is_public_module_name(name: str) -> bool:
    parts = name.split(".")
    if parts[0] in SKIPPED_MODULES:
        return False
    return not any(p.startswith("_") or p in SKIPPED_NAME_PARTS for p in parts)


def import_quietly(name: str):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - any import failure just skips the module
            return None


def is_in_stdlib_dir(module) -> bool:
    path = getattr(module, "__file__", None)
    if path is None:
        return True  # built into the interpreter
    return Path(path).resolve().is_relative_to(Path(sysconfig.get_paths()["stdlib"]).resolve())


def submodule_names(module) -> list[str]:
    path = getattr(module, "__path__", None)
    if path is None:
        return []
    prefix = module.__name__ + "."
    return [info.name for info in pkgutil.iter_modules(path, prefix)]


def stdlib_module_names() -> list[str]:
    pending = sorted(n for n in sys.stdlib_module_names if is_public_module_name(n))
    found = set()
    while pending:
        name = pending.pop()
        if name in found:
            continue
        module = import_quietly(name)
        if module is None or not is_in_stdlib_dir(module):
            continue
        found.add(name)
        pending.extend(n for n in submodule_names(module) if is_public_module_name(n))
    return sorted(found)


def clean_doc(obj) -> str:
    doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else ""
    doc = inspect.cleandoc(doc)
    return doc if len(doc) >= MIN_DOCSTRING_CHARS else ""


def stable_default(param: inspect.Parameter) -> inspect.Parameter:
    default = param.default
    if default is param.empty:
        return param
    is_local_path = isinstance(default, str) and Path(default).is_absolute() and len(default) > 1
    is_short_literal = len(repr(default)) <= MAX_DEFAULT_REPR_CHARS
    if type(default) in LITERAL_TYPES and is_short_literal and not is_local_path:
        return param
    return param.replace(default=ElidedDefault())


def signature_text(name: str, obj) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = [stable_default(p) for p in signature.parameters.values()]
    return f"{name}{signature.replace(parameters=params)}"


def public_members(container, module_name: str) -> list[tuple[str, object]]:
    members = []
    for name, obj in sorted(vars(container).items()):
        if name.startswith("_"):
            continue
        if getattr(obj, "__module__", module_name) != module_name:
            continue  # re-exported from elsewhere; documented where it is defined
        members.append((name, obj))
    return members


def class_document(module_name: str, name: str, cls) -> str:
    parts = [f"class {module_name}.{signature_text(name, cls)}", clean_doc(cls)]
    for method_name, method in public_members(cls, module_name):
        if callable(method) or isinstance(method, (property, classmethod, staticmethod)):
            target = getattr(method, "__func__", method)
            doc = clean_doc(target)
            if doc:
                parts.append(f"{signature_text(method_name, target)}\n{doc}")
    return "\n\n".join(p for p in parts if p)


def module_documents(module_name: str) -> Iterator[str]:
    module = sys.modules[module_name]
    parts = [f"Module {module_name}", clean_doc(module)]
    for name, obj in public_members(module, module_name):
        if inspect.isclass(obj):
            yield class_document(module_name, name, obj)
        elif callable(obj):
            doc = clean_doc(obj)
            if doc:
                parts.append(f"{signature_text(name, obj)}\n{doc}")
    yield "\n\n".join(p for p in parts if p)


def pydoc_topic_documents() -> Iterator[str]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield topics[name].strip()


def chunk_paragraphs(text: str, max_chars: int) -> Iterator[str]:
    chunk = []
    size = 0
    for paragraph in text.split("\n\n"):
        if chunk and size + len(paragraph) > max_chars:
            yield "\n\n".join(chunk).strip()
            chunk, size = [], 0
        chunk.append(paragraph)
        size += len(paragraph) + 2
    if chunk:
        yield "\n\n".join(chunk).strip()


def rst_files(root: Path) -> list[Path]:
    files = []
    for section in RST_SECTIONS:
        path = root / section
        files.extend([path] if path.is_file() else path.rglob("*.txt"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def rst_documents(root: Path) -> Iterator[str]:
    if not root.is_dir():
        raise SystemExit(f"{root} not found; run: apt-get install -y python3.11-doc")
    for path in rst_files(root):
        yield from chunk_paragraphs(path.read_text(encoding="utf-8"), RST_CHUNK_CHARS)


def all_documents(rst_root: Path) -> Iterator[str]:
    for module_name in stdlib_module_names():
        yield from module_documents(module_name)
    yield from pydoc_topic_documents()
    yield from rst_documents(rst_root)


def unique_long_documents(documents: Iterator[str]) -> Iterator[str]:
    seen = set()
    for text in documents:
        digest = hashlib.sha256(text.encode()).digest()
        if len(text) >= MIN_DOCUMENT_CHARS and digest not in seen:
            seen.add(digest)
            yield text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("torchtitan/assets/sample_corpus.jsonl"))
    parser.add_argument("--rst-sources", type=Path, default=RST_SOURCES)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # deprecated modules warn when their docstrings are read
    texts = list(unique_long_documents(all_documents(args.rst_sources)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    total_chars = sum(len(t) for t in texts)
    print(f"wrote {len(texts)} documents, {total_chars} chars, to {args.out}")


if __name__ == "__main__":
    main()
