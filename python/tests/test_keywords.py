"""The keywords of gpufeed.Pipeline come from one table in the binding: help() shows each with
its type and default, the installed .pyi stub lists the same ones with the same types and
defaults, a misspelt keyword's error names them all, and each default is what the pipeline
does when the keyword is left out."""

import ast
import inspect
import pathlib
import pydoc

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS, ROOT

TABLE = gpufeed._native._keyword_table()
NAMES = [name for name, _, _, _ in TABLE]
PACKAGE = pathlib.Path(gpufeed.__file__).parent


def normalized(expression):
    """Python source text in one spelling (quotes, spaces), to compare two writings of it."""
    return ast.unparse(ast.parse(expression, mode="eval").body)


def stub_parameters():
    """(name, type, default) of every parameter of Pipeline.__init__ in the installed stub."""
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    (pipeline,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Pipeline"]
    (init,) = [n for n in pipeline.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    arguments = init.args
    positional = arguments.args[1:]  # after self
    defaults = [None] * (len(positional) - len(arguments.defaults)) + arguments.defaults
    pairs = list(zip(positional, defaults)) + list(zip(arguments.kwonlyargs, arguments.kw_defaults))
    assert not arguments.vararg and not arguments.kwarg, "the stub lists every keyword by name"
    return [
        (a.arg, ast.unparse(a.annotation), ast.unparse(d) if d is not None else None)
        for a, d in pairs
    ]


def test_the_keyword_table_has_every_keyword_once():
    assert len(NAMES) == len(set(NAMES))
    assert list(gpufeed.KEYWORDS) == NAMES
    for name in ("source", "paths", "labels", "image_folder", "webdataset", "state", "cache_dir",
                 "cache_limit", "read_budget", "batch_size", "decode", "recipe"):
        assert name in NAMES


def test_help_names_every_keyword_with_its_type_and_default():
    text = pydoc.render_doc(gpufeed.Pipeline, renderer=pydoc.plaintext)
    signature = inspect.signature(gpufeed.Pipeline)
    assert list(signature.parameters) == NAMES
    for name, python_type, default, doc in TABLE:
        assert f"{name}: {python_type} = {default}" in text, name
        assert " ".join(doc.split()[:4]) in " ".join(text.split()), name
        parameter = signature.parameters[name]
        assert parameter.default == ast.literal_eval(default), name
        kind = parameter.POSITIONAL_OR_KEYWORD if name == "source" else parameter.KEYWORD_ONLY
        assert parameter.kind == kind, name
    # The binding's own text signature (the keywords it binds by name before **options) names
    # only keywords of the table, in the table's order.
    bound = [
        p.strip().split("=")[0]
        for p in gpufeed.Pipeline.__text_signature__.strip("()").split(",")
        if p.strip() not in ("*", "**options") and not p.strip().startswith("$")
    ]
    assert bound == NAMES[: len(bound)]


def test_the_installed_stub_lists_the_same_keywords_types_and_defaults():
    assert (PACKAGE / "py.typed").is_file(), "py.typed is installed with the package"
    stub = stub_parameters()
    table = [(name, normalized(t), normalized(d)) for name, t, d, _ in TABLE]
    expected = "\n".join(f"        {n}: {t} = {d}," for n, t, d, _ in TABLE)
    assert [s[0] for s in stub] == NAMES, f"the stub's keywords, as the table has them:\n{expected}"
    assert stub == table, f"the stub's keywords, as the table has them:\n{expected}"


def test_a_misspelt_keyword_names_every_keyword():
    with pytest.raises(TypeError) as raised:
        gpufeed.Pipeline(ASSETS, device="cpu", batchsize=4)
    message = str(raised.value)
    assert "batchsize" in message and "did you mean batch_size?" in message
    listed = message.split("the keywords are: ")[1].split(", ")
    assert listed == NAMES
    with pytest.raises(TypeError, match="cache_limit, read_budget"):
        gpufeed.Pipeline(ASSETS, device="cpu", nothing_like_any=1)


def test_every_default_is_what_leaving_the_keyword_out_gives():
    # Every keyword the builder takes, given its default from the signature, against none given.
    constructor = {"source", "paths", "labels", "image_folder", "webdataset", "state", "cache_dir",
                   "cache_limit", "read_budget", "max_requests", "shuffle_window", "device",
                   "parquet", "image_column", "label_column", "extra_columns", "split"}
    given = {
        name: ast.literal_eval(default)
        for name, _, default, _ in TABLE
        if name not in constructor
    }

    def epoch(**keywords):
        pipe = gpufeed.Pipeline(ASSETS, device="cpu", **keywords)
        batches = list(pipe)
        return [i for b in batches for i in b.ids], np.concatenate(
            [np.from_dlpack(b.images) for b in batches]
        )

    plain_ids, plain = epoch()
    ids, rows = epoch(**given)
    assert ids == plain_ids
    assert rows.dtype == plain.dtype and (rows.view(np.uint16) == plain.view(np.uint16)).all()
    # A None given where None is the default reads as left out, with train=True too.
    train_ids, train_rows = epoch(train=True, seed=3, batch_size=4)
    nones = {name: None for name, _, default, _ in TABLE if default == "None" and name in given}
    again_ids, again_rows = epoch(train=True, seed=3, batch_size=4, **nones)
    assert again_ids == train_ids and (again_rows.view(np.uint16) == train_rows.view(np.uint16)).all()


def test_the_python_page_lists_every_keyword_as_the_table_does():
    page = (ROOT / "docs" / "python.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    expected = [
        "| `{}` | `{}` | {} |".format(name, default.replace("|", "\\|"), doc)
        for name, _, default, doc in TABLE
    ]
    assert rows == expected, "docs/python.md's keyword table, as the binding has it:\n" + "\n".join(expected)
