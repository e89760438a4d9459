"""The package's layering, read from the source: who may import whom, and where private APIs live."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_privacy"

# Lower layers first; a module may import its own layer and any layer before it (see docs/architecture.md).
LAYERS = ["analysis", "functional", "metrics", "dpsgd", "audits", "callbacks", "commands"]

# The modules at the package's top level, each in the lowest layer its imports allow: "analysis" imports neither
# torch nor Lightning nor Opacus, "functional" may (torch, Opacus, a LightningModule), and a module that imports a
# layer sits in it. A new top-level module needs an entry here.
TOP_LEVEL = {
    "_validation": "analysis",  # argument checks, plain Python
    "_deprecation": "analysis",  # the moved names of deprecated module paths, plain Python
    "names": "analysis",  # the logged keys
    "reporting": "analysis",  # ReportSection: the report's protocol, plain Python
    "attribute_ledger": "analysis",  # β*_AI's composition (analysis.composition)
    "_compat": "functional",  # private Lightning / Opacus / torch APIs
    "attributes": "functional",  # SensitiveAttribute (torch)
    "bookkeeping": "dpsgd",  # re-exports dpsgd.bookkeeping (deprecated in 0.3.0, removed in 0.4.0)
    "sampling": "dpsgd",  # re-exports dpsgd.sampling (deprecated in 0.3.0, removed in 0.4.0)
    "noise": "dpsgd",  # re-exports dpsgd.noise (deprecated in 0.3.0, removed in 0.4.0)
    "figures": "audits",  # the callbacks' matplotlib figures (the audits' region and ROC axes)
    "statement": "callbacks",  # the privacy statement of a run or checkpoint (a package: reading, checks, renderings)
    "ledger": "functional",  # PrivacyLedger (Opacus accountants)
    "claims": "functional",  # Claim (the ledger)
    "checkpoints": "functional",  # load_checkpoint (Opacus fixers, the ledger)
    "models": "functional",  # TabularMLP (a LightningModule)
    "references": "callbacks",  # reference models trained by a Trainer, with DPSGD where asked
    "report": "callbacks",  # the privacy report (reads callbacks._audit_utils)
    "loggers": "callbacks",  # figures, histograms and text on every Lightning logger (the callbacks' writing)
    "cli": "commands",  # the console script
}

# Private attributes of Lightning, Opacus, torch, TensorBoard and SDV; only _compat.py may touch them.
PRIVATE = re.compile(
    r"_accelerator_connector|\._data_source|_DataLoaderSource|getclosurevars|_get_file_writer|"
    r"\._forward_hooks|\._forward_pre_hooks|\._backward_hooks|\._backward_pre_hooks|_full_backward_hooks|"
    r"_set_random_state|\._norm_sample"
)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def _imports(tree):
    """The modules a module imports (``from lightning_privacy import names`` counts as ``lightning_privacy.names``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _layer(path: Path):
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


def _imported_layer(name: str):
    """The layer of an imported ``lightning_privacy`` module (a layer's package or a top-level module), else None."""
    parts = name.split(".")
    if parts[0] != "lightning_privacy" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else TOP_LEVEL.get(parts[1])


def _above(name: str, layer: str) -> bool:
    imported = _imported_layer(name)
    return imported is not None and LAYERS.index(imported) > LAYERS.index(layer)


def test_private_apis_only_in_compat():
    offenders = []
    for path, _ in _modules():
        if path.name == "_compat.py":
            continue
        # docstrings and comments may name them (e.g. a doctest that checks hooks are gone): strip those
        code = ast.unparse(ast.parse(path.read_text(encoding="utf-8")))
        code = re.sub(r"(?s)('''|\"\"\").*?\1", "", code)
        for line in code.splitlines():
            if PRIVATE.search(line) and not line.lstrip().startswith(("'", '"', ">>>")):
                offenders.append(f"{path.relative_to(PACKAGE)}: {line.strip()}")
    assert not offenders, "private APIs outside _compat.py:\n" + "\n".join(offenders)


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_only_downwards(layer):
    """A layer's modules import no higher layer, neither its package nor a top-level module placed above it."""
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == layer
        for name in _imports(tree)
        if _above(name, layer)
    ]
    assert not wrong, "\n".join(wrong)


def test_top_level_modules_import_only_downwards():
    """Every top-level module has a layer (``TOP_LEVEL``) and imports nothing above it; those in ``analysis`` load no
    torch, Lightning or Opacus. A package placed in ``TOP_LEVEL`` (``statement/``) sits in one layer, every module of
    it."""
    tops = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    tops = sorted([*tops, *(name for name in TOP_LEVEL if (PACKAGE / name / "__init__.py").is_file())])
    assert sorted(TOP_LEVEL) == tops, "give each top-level module a layer in TOP_LEVEL"
    wrong = []
    for stem, layer in TOP_LEVEL.items():
        package = PACKAGE / stem
        for file in sorted(package.rglob("*.py")) if package.is_dir() else [PACKAGE / f"{stem}.py"]:
            for name in _imports(ast.parse(file.read_text(encoding="utf-8"))):
                heavy = layer == "analysis" and name.split(".")[0] in ("torch", "lightning", "opacus")
                if heavy or _above(name, layer):
                    wrong.append(f"{file.relative_to(PACKAGE)} ({layer}) imports {name}")
    assert not wrong, "\n".join(wrong)


def test_commands_import_no_callback_module():
    """Commands call the package's functions, not its callbacks: DP reference models for ``audit membership`` come
    from :mod:`lightning_privacy.references`."""
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == "commands"
        for name in _imports(tree)
        if name.startswith("lightning_privacy.callbacks")
    ]
    assert not wrong, "\n".join(wrong)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """Module → the package's modules it imports, at the top or inside a function, and the modules a package's
    ``__getattr__`` names as strings (its lazy exports). Importing a module runs its parent packages first, so an
    edge to an ancestor package (``from lightning_privacy.data import adult`` inside ``data/``) is not a choice the
    module made and is left out."""
    modules = {_module_name(path): tree for path, tree in _modules()}
    graph = {}
    for name, tree in modules.items():
        targets = {t for t in _imports(tree) if t in modules}
        targets |= {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules
        }
        ancestors = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        graph[name] = targets - {name} - ancestors
    return graph


def test_no_module_imports_itself_through_others():
    """No circle in the import graph (Tarjan's strongly connected components of more than one module)."""
    graph, index, low, stack, on_stack, circles = _import_graph(), {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles
    assert "lightning_privacy.dpsgd.backward" in graph  # (the graph is the package's)


def test_lower_layers_neither_import_nor_lazily_export_the_callbacks():
    """analysis/, functional/, metrics/, dpsgd/ and audits/ name no module of callbacks/ or commands/ (imports and
    lazy-export strings alike), nor a top-level module above them."""
    graph = _import_graph()
    wrong = [
        f"{source} → {target}"
        for source, targets in graph.items()
        if _imported_layer(source) in ("analysis", "functional", "metrics", "dpsgd", "audits")
        for target in targets
        if _above(target, _imported_layer(source))
    ]
    assert not wrong, "\n".join(wrong)
    assert graph["lightning_privacy.audits"] == set(graph["lightning_privacy.audits"]) - {
        "lightning_privacy.references"
    }


# The engine's modules that meet the Trainer (its strategies, loaders, hooks and callbacks list); the others import
# from Lightning at most the MisconfigurationException that users catch, and the pure ones not even that.
ENGINE_TRAINER = {
    "auto", "backward", "functional_mode", "install", "loaders", "run", "self_checks", "settings", "state", "strategies"
}  # fmt: skip
ENGINE_EXCEPTION_ONLY = {
    "checks", "exactness", "functional", "ghost_mode", "modes", "neighbours", "noise_check", "sampled_exactness",
    "samplers", "step_guards",
}  # fmt: skip


def test_the_engine_meets_lightning_only_where_it_meets_the_trainer():
    engine = sorted(p.stem for p in (PACKAGE / "dpsgd").glob("*.py") if p.stem != "__init__")
    assert set(engine) >= ENGINE_TRAINER | ENGINE_EXCEPTION_ONLY
    wrong = []
    for stem in engine:
        lightning = {
            name
            for name in _imports(ast.parse((PACKAGE / "dpsgd" / f"{stem}.py").read_text(encoding="utf-8")))
            if name.split(".")[0] in ("lightning", "pytorch_lightning")
        }
        allowed = (
            lightning
            if stem in ENGINE_TRAINER
            else {
                "lightning.pytorch.utilities.exceptions",
                "lightning.pytorch.utilities.exceptions.MisconfigurationException",
            }
            if stem in ENGINE_EXCEPTION_ONLY
            else set()
        )
        wrong += [f"dpsgd/{stem}.py imports {name}" for name in sorted(lightning - allowed)]
    assert not wrong, "\n".join(wrong)


def test_callbacks_hold_callbacks_and_the_little_they_share():
    """callbacks/: one callback a file plus what they share (report sections, logging, HPARAMS): at most 16 files
    and 3,500 lines; the DP-SGD engine lives in dpsgd/."""
    files = sorted((PACKAGE / "callbacks").glob("*.py"))
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)
    assert len(files) <= 16 and lines <= 3500, (len(files), lines)
    private = {p.stem for p in files if p.stem.startswith("_") and p.stem != "__init__"}
    assert private <= {"_audit_utils", "_sections", "_hparams", "_attribute_checks"}, private


def test_each_mode_of_the_engine_stays_under_300_lines():
    """Issue 57 item 7: DPSGD's stand-in dispatches to one small class per mode (hooks, ghost, functional, auto)."""
    for stem in ("backward", "modes", "hooks_mode", "ghost_mode", "functional_mode", "auto", "step_guards"):
        n = len((PACKAGE / "dpsgd" / f"{stem}.py").read_text(encoding="utf-8").splitlines())
        assert n <= 300, (stem, n)


def test_each_callback_module_stays_under_300_lines():
    """STYLE.md: our callbacks stay under 300 lines, the math and the machinery elsewhere (MembershipAudit's reference
    recipe is ``references.recipe_like``)."""
    long = {
        p.stem: n
        for p in sorted((PACKAGE / "callbacks").glob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300
    }
    assert not long, long


def test_the_audit_functions_are_importable_from_the_top_level_lazily():
    """``from lightning_privacy import audit_membership`` (and every audit function of ``lightning_privacy.audits``,
    ``train_references``, ``load_checkpoint``) gives the same objects as their modules; ``import lightning_privacy``
    still loads neither torch nor Lightning."""
    code = (
        "import sys, lightning_privacy\n"
        "print(sorted(k for k in ('torch', 'lightning') if k in sys.modules))\n"
        "from lightning_privacy import audit_membership\n"
        "print(audit_membership.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "lightning_privacy.audits.membership"]
    import lightning_privacy
    import lightning_privacy.audits as audits
    from lightning_privacy import checkpoints, references

    functions = sorted(name for name in audits.__all__ if name.startswith("audit_") or name.endswith("_canaries"))
    assert len(functions) == 9, functions
    for name in functions:
        assert getattr(lightning_privacy, name) is getattr(audits, name), name
        assert name in lightning_privacy.__all__ and name in dir(lightning_privacy)
    assert lightning_privacy.train_references is references.train_references
    assert lightning_privacy.load_checkpoint is checkpoints.load_checkpoint


def test_analysis_stands_alone():
    """analysis/ is numpy/scipy only: it imports nothing else from the package, and loading it loads no torch."""
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path, tree in _modules()
        if _layer(path) == "analysis"
        for name in _imports(tree)
        if name.split(".")[0] in ("torch", "lightning", "opacus")
        or (name.startswith("lightning_privacy") and not name.startswith("lightning_privacy.analysis"))
    ]
    assert not wrong, "\n".join(wrong)
    modules = sorted(p.stem for p in (PACKAGE / "analysis").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('lightning_privacy.analysis.' + m)\n"
        "print(sorted(k for k in ('torch', 'lightning', 'opacus') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_old_module_paths_keep_re_exporting():
    """The engine moved to dpsgd/ and reference training above the callbacks: the old public paths (0.2.0's
    ``lightning_privacy.sampling``, ``.noise``, ``.bookkeeping``) give the same objects, each with a DeprecationWarning
    naming the new import and the removal version, pointing at the importing line;
    ``lightning_privacy.audits.train_references`` names its new home."""
    import warnings

    import lightning_privacy
    from lightning_privacy import bookkeeping, noise, references, sampling
    from lightning_privacy.callbacks import references as callback_references
    from lightning_privacy.dpsgd import bookkeeping as new_bookkeeping
    from lightning_privacy.dpsgd import noise as new_noise
    from lightning_privacy.dpsgd import sampling as new_sampling

    for old, new in ((sampling, new_sampling), (noise, new_noise), (bookkeeping, new_bookkeeping)):
        assert old.__all__ and sorted(dir(old)) == sorted(old.__all__)
        stem = old.__name__.rsplit(".", 1)[1]
        for name in old.__all__:
            moved = rf"lightning_privacy\.{stem}\.{name} moved to lightning_privacy\.dpsgd\.{stem}\.{name} in 0\.3\.0"
            with pytest.warns(DeprecationWarning, match=rf"^{moved} and this path is removed in 0\.4\.0") as caught:
                assert getattr(old, name) is getattr(new, name)
            assert caught[0].filename == __file__  # the user's line, not the shim's
        with pytest.raises(AttributeError, match=rf"lightning_privacy\.{stem}' has no attribute 'nothing'"):
            old.nothing  # noqa: B018
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from lightning_privacy.sampling import PoissonDataLoader  # noqa: F401
    assert [w.category for w in caught] == [DeprecationWarning] and caught[0].filename == __file__
    assert "`from lightning_privacy.dpsgd.sampling import PoissonDataLoader`" in str(caught[0].message)
    assert set(new_sampling.__all__) - set(sampling.__all__) == {"batch_rows", "is_empty_batch"}
    assert callback_references.train_references is references.train_references
    assert lightning_privacy.DPSGD.__module__ == "lightning_privacy.callbacks.dpsgd"
    import lightning_privacy.audits as audits

    with pytest.raises(AttributeError, match=r"moved to lightning_privacy\.references\.train_references"):
        audits.train_references  # noqa: B018
