"""The code the probe hooks, read from the source of every vLLM release it claims to fit (0.31.0 and
0.32.0 as installed for the tests, 0.30.0 and 0.33.0 from their source archives, never installed): each
wrapped method takes the parameters the probe was written against, each attribute the hooks read is
still set, and set_inputs_first_pass still returns token_indices_to_sample where the hooks take it. A
release that changes any of them fails here, on a CPU, before anyone runs it."""

import ast
import sys
import tarfile
from pathlib import Path

import pytest

from devtools.vllm_sources import RELEASES, archive

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "probe"))

from eagle_probe import CHECKED_VERSIONS  # noqa: E402
from eagle_probe.drafts import FIRST_PASS_SAMPLED  # noqa: E402
from eagle_probe.hooks import HOOKED, READS  # noqa: E402

INSTALLED = {"0.32.0": ROOT / ".venv-vllm", "0.31.0": ROOT / ".venv-vllm-0.31"}


MODULES = {module for module, *_ in [*HOOKED, *READS]}


class Source:
    """The modules the probe hooks or reads of one release, by dotted name, as parsed source."""

    def __init__(self, version: str):
        self.version = version
        paths = {name.replace(".", "/") + ".py": name for name in MODULES}
        if version in INSTALLED:
            site = next(INSTALLED[version].glob("lib/python3*/site-packages"))
            texts = {name: (site / path).read_text() for path, name in paths.items()}
        else:   # one pass through the archive: a gzip stream read again from its start for every member is slow
            with tarfile.open(archive(version)) as members:
                texts = {paths[m.name.partition("/")[2]]: members.extractfile(m).read().decode()
                         for m in members if m.name.partition("/")[2] in paths}
        self.modules = {name: ast.parse(text) for name, text in texts.items()}

    def module(self, name: str) -> ast.Module:
        return self.modules[name]

    def cls(self, module: str, name: str) -> ast.ClassDef:
        found = [node for node in self.module(module).body if isinstance(node, ast.ClassDef) and node.name == name]
        assert found, f"vLLM {self.version}: {module} has no class {name}"
        return found[0]


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == name]
    assert found, f"{cls.name} has no method {name}"
    return found[0]


def parameters(function: ast.FunctionDef) -> tuple[str, ...]:
    """Its parameters' names in inspect.signature's order."""
    a = function.args
    return tuple(p.arg for p in [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
                                  *([a.kwarg] if a.kwarg else [])])


def attributes(cls: ast.ClassDef) -> set[str]:
    """What an instance of the class has by its own source: fields declared in its body, properties, and
    attributes its methods set on self."""
    names = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if isinstance(node, ast.FunctionDef) and any(getattr(d, "id", "") == "property" for d in node.decorator_list):
            names.add(node.name)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(one, ast.Attribute) and getattr(one.value, "id", "") == "self":
                    names.add(one.attr)
    return names


def test_every_release_the_probe_names_is_checked_here():
    assert set(CHECKED_VERSIONS) == set(INSTALLED) | set(RELEASES)


@pytest.fixture(scope="module", params=sorted(set(INSTALLED) | set(RELEASES)))
def source(request) -> Source:
    return Source(request.param)


def test_the_wrapped_methods_take_the_parameters_the_probe_was_written_against(source):
    for (module, cls, name), expected in HOOKED.items():
        assert parameters(method(source.cls(module, cls), name)) == expected, (source.version, cls, name)


def test_every_attribute_the_hooks_read_is_still_set(source):
    for (module, cls), names in READS.items():
        has = attributes(source.cls(module, cls))
        assert not set(names) - has, (source.version, cls, sorted(set(names) - has))


def test_the_first_pass_still_returns_the_rows_it_samples_where_the_hooks_take_them(source):
    first_pass = method(source.cls("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer"),
                        "set_inputs_first_pass")
    returns = [node.value for node in ast.walk(first_pass) if isinstance(node, ast.Return) and node.value]
    assert returns and all(isinstance(r, ast.Tuple) and getattr(r.elts[FIRST_PASS_SAMPLED], "id", "")
                           == "token_indices_to_sample" for r in returns), source.version


def test_the_check_fails_on_a_release_that_changed():
    """The checks above against a class edited as a later release might: a parameter renamed, an
    attribute no longer set, the sampled rows returned elsewhere."""
    changed = ast.parse("""
class SpecDecodeBaseProposer:
    def __init__(self, config):
        self.method = config.method
        self.parallel_drafting: bool = False
    def _sample_draft_tokens(self, hidden_states, metadata):
        pass
    def set_inputs_first_pass(self, target_token_ids):
        return token_indices_to_sample, num_tokens
""").body[0]
    assert parameters(method(changed, "_sample_draft_tokens")) != HOOKED[
        ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer", "_sample_draft_tokens")]
    assert {"model", "use_heterogeneous_vocab"} == set(READS[
        ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer")]) - attributes(changed)
    returned = [n.value for n in ast.walk(method(changed, "set_inputs_first_pass")) if isinstance(n, ast.Return)]
    assert getattr(returned[0].elts[FIRST_PASS_SAMPLED], "id", "") != "token_indices_to_sample"
