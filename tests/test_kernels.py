import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from playground.engines.request import GenerationRequest
from playground.model import kernels
from playground.model.packed_linear import PackedLinear


@pytest.fixture(autouse=True)
def _kernels_loaded(request):
    """Every test here but those marked pytorch_kernels needs our kernels: skipped, with the reason, on a
    CPU they cannot run on (where they should run, a failed build fails test_the_kernels_build_and_load_here)."""
    if not kernels.cpu_runs_them() and request.node.get_closest_marker("pytorch_kernels") is None:
        pytest.skip("this CPU has no AVX2: the playground runs on PyTorch's kernels")
    kernels.status()


def test_the_kernels_build_and_load_here():
    # the figures in docs/performance.md are this kernel's: a silent fallback would make them false
    assert kernels.status().loaded, kernels.status().note


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 13])
@pytest.mark.parametrize("n", [1, 4, 13, 200])
@pytest.mark.parametrize("k", [48, 40])   # 40: a 16-float build's 8-lane tail
def test_rows_linear_is_x_times_w_transposed(rows, n, k):
    torch.manual_seed(rows * 1000 + n + k)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    torch.testing.assert_close(torch.ops.playground.rows_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    torch.manual_seed(0)
    x, w = torch.randn(1, 13, 576), torch.randn(1000, 576)
    together = torch.ops.playground.rows_linear(x, w)
    assert together.shape == (1, 13, 1000)
    alone = torch.cat([torch.ops.playground.rows_linear(x[:, i:i + 1], w) for i in range(13)], dim=1)
    assert torch.equal(together, alone)


@pytest.fixture
def two_threads():
    """Two halves of a vocabulary at least, whatever the host: one core's rejections stop the other's rows."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    yield
    torch.set_num_threads(threads)


def _cpu_ticks_by_thread() -> dict[str, int]:
    """User and system clock ticks of each thread of this process (/proc/self/task/*/stat)."""
    ticks = {}
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:   # a thread that ended meanwhile
            continue
        ticks[stat.parent.name] = int(fields[11]) + int(fields[12])
    return ticks


def test_a_projection_is_split_between_both_threads(two_threads):
    """Each thread reads its share of the weight rows: over many calls, the second busiest thread works
    about as long as the busiest (the clock ticks every 10 ms, so the calls last a second or two)."""
    w, x = torch.randn(16384, 576), torch.randn(1, 576)
    before = _cpu_ticks_by_thread()
    for _ in range(600):
        torch.ops.playground.rows_linear(x, w)
    after = _cpu_ticks_by_thread()
    busy = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
    assert busy[0] >= 20 and busy[1] > 0.4 * busy[0], busy


def _needed_argmax(logits: torch.Tensor, tokens: list[int], parents: list[int]) -> list[int]:
    """Every row's argmax where a greedy verify needs it (its drafts all accepted so far), else -1."""
    argmax = logits.argmax(-1).tolist()
    needed = [True]
    for token, parent in zip(tokens, parents):
        needed.append(needed[parent] and argmax[parent] == token)
    return [a if n else -1 for a, n in zip(argmax, needed)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_verify_argmax_is_the_logits_argmax_of_every_row_a_verify_needs(dtype, shape, two_threads):
    """Drafts their parent's argmax keeps or not, ties (equal weight rows: the first id wins, as
    torch.argmax), one row (plain decoding) to 13 (rows taken tile by tile), a vocabulary split
    between both cores; a row no verify can need is -1."""
    generator = torch.Generator().manual_seed(3)
    w = torch.randn(5000, 64, generator=generator).to(dtype)
    w[3000] = w[4000] = w[100]
    needed_rows = []
    for trial in range(240):
        rows = 1 + trial % 13 if trial < 220 else (30, 64)[trial % 2]   # 25-64 rows: blocks in L2
        x = torch.randn(rows, 64, generator=generator)
        if trial % 5 == 0:
            x[0] = 3 * w[100].float()   # its argmax is 100, tied with 3000 and 4000
        logits = torch.ops.playground.rows_linear(x, w)
        argmax = logits.argmax(-1).tolist()
        parents = (list(range(rows - 1)) if shape == "chain"
                   else [int(torch.randint(i + 1, (1,), generator=generator)) for i in range(rows - 1)])
        tokens = [argmax[p] if torch.rand(1, generator=generator) < 0.7 else int(torch.randint(5000, (1,), generator=generator))
                  for p in parents]
        if trial % 5 == 0 and rows > 1:
            tokens[0] = 4000 if trial % 10 else 100   # tied with the argmax: a later id rejected, the first kept
        expected = _needed_argmax(logits, tokens, parents)
        assert torch.ops.playground.verify_argmax(x, w, tokens, parents).tolist() == expected, trial
        needed_rows.append(sum(a >= 0 for a in expected) / rows)
    assert 0.2 < sum(needed_rows) / len(needed_rows) < 0.9   # both kinds of rows, often


def test_verify_argmax_puts_nan_first_as_torch_argmax_does():
    w = torch.randn(300, 16)
    w[200, 3] = w[100, 5] = float("nan")
    x = torch.randn(3, 16)
    logits = torch.ops.playground.rows_linear(x, w)
    assert logits.argmax(-1).tolist() == [100, 100, 100]
    for tokens in ([100, 100], [200, 100], [5, 6]):
        assert torch.ops.playground.verify_argmax(x, w, tokens, [0, 1]).tolist() == _needed_argmax(logits, tokens, [0, 1])


def test_greedy_tokens_on_the_targets_head_are_its_logits_argmax(target):
    out = target.forward(torch.tensor([[504, 3426, 314, 260, 1345, 28, 1052]]), target.new_cache(16))
    logits = out.logits[0]
    argmax = logits.argmax(-1).tolist()
    chain = [0, 1, 2, 3, 4, 5]
    tree = [0, 0, 1, 1, 2, 4]
    for tokens, parents in ((argmax[:6], chain), (argmax[:3] + [7, 8, 9], chain), ([5] + argmax[1:6], chain),
                            ([], []), ([argmax[0], 9, argmax[1], argmax[1], 7, argmax[4]], tree)):
        rows = len(tokens) + 1
        greedy = target.greedy_tokens(out.final_hidden[0, :rows], tokens, parents)
        assert greedy == _needed_argmax(logits[:rows], tokens, parents)
    # past the kernel's rows (a tree of 64 nodes), the head's logits: every row's argmax
    final = out.final_hidden[0, torch.arange(kernels.ROWS_KERNEL_MAX + 1) % 7]
    argmax = target.lm_head(final).argmax(-1).tolist()
    assert target.greedy_tokens(final, argmax[:-1], list(range(len(argmax) - 1))) == argmax


def test_verify_argmax_refuses_what_it_cannot_verify():
    x, w = torch.randn(3, 16), torch.randn(40, 16)
    with pytest.raises(RuntimeError, match="a token and a parent for each row but the first"):
        torch.ops.playground.verify_argmax(x, w, [1], [0])
    with pytest.raises(RuntimeError, match="token 40 out of range"):
        torch.ops.playground.verify_argmax(x, w, [1, 40], [0, 1])
    with pytest.raises(RuntimeError, match="a draft's parent is a row before it"):
        torch.ops.playground.verify_argmax(x, w, [1, 2], [0, 2])
    rows = kernels.ROWS_KERNEL_MAX   # the Python side's limit is the kernel's own
    assert len(torch.ops.playground.verify_argmax(torch.randn(rows, 16), w, [1] * (rows - 1), [0] * (rows - 1))) == rows
    with pytest.raises(RuntimeError, match=f"1 to {rows} rows"):
        torch.ops.playground.verify_argmax(torch.randn(rows + 1, 16), w, [1] * rows, [0] * rows)


def test_rows_linear_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch.ops.playground.rows_linear(torch.randn(1, 12), torch.randn(4, 12))
    with pytest.raises(RuntimeError, match="float32 x; w a contiguous float32 or bfloat16"):
        torch.ops.playground.rows_linear(torch.randn(1, 16).double(), torch.randn(4, 16).double())
    with pytest.raises(RuntimeError, match="GGUF blocks"):   # 30 bytes a row: not whole Q4_1 blocks
        torch.ops.playground.rows_linear(torch.randn(1, 32), torch.zeros(4, 30, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="last dimension must be w's"):   # one Q8_0 block: 32 weights, not 16
        torch.ops.playground.rows_linear(torch.randn(1, 16), torch.zeros(4, 34, dtype=torch.int8))


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")   # mkldnn.flags sets TF32 too
def test_packed_linear_takes_the_kernel_for_few_rows_and_onednn_for_prompts():
    torch.manual_seed(1)
    weights = torch.randn(96, 64), torch.randn(32, 64)
    linear = PackedLinear(*weights, kernels=True)
    assert linear.rows_kernel and not linear.onednn
    for rows in (1, 64, 65):  # up to 64 rows our kernel, more oneDNN's gemm (rows_linear.cpp)
        x = torch.randn(1, rows, 64)
        first, second = linear.split(x)
        torch.testing.assert_close(first, F.linear(x, weights[0]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(second, F.linear(x, weights[1]), rtol=1e-5, atol=1e-5)
    assert torch.backends.mkldnn.is_available()
    x = torch.randn(65, 64)
    assert torch.equal(linear(x), _onednn_linear(x, torch.cat(weights)))
    with torch.backends.mkldnn.flags(enabled=False):   # MKL's sgemm
        assert torch.equal(linear(x), F.linear(x, torch.cat(weights)))


def test_a_weight_of_bfloat16_values_is_kept_in_bfloat16_with_the_same_products():
    torch.manual_seed(2)
    weight = torch.randn(300, 64).bfloat16().float()
    linear = PackedLinear(weight, kernels=True)
    assert linear.weight.dtype == torch.bfloat16
    for rows in (1, 6, 13):
        x = torch.randn(rows, 64)
        assert torch.equal(linear(x), torch.ops.playground.rows_linear(x, weight))
    x = torch.randn(65, 64)  # a prompt: oneDNN's gemm on the widened weight
    assert torch.equal(linear(x), _onednn_linear(x, weight))
    assert PackedLinear(torch.randn(8, 64), kernels=True).weight.dtype == torch.float32


def _status_in_a_fresh_process(tmp_path, **env) -> str:
    code = ("from playground.model import kernels; from playground.model.packed_linear import PackedLinear; "
            "import torch; s = kernels.status(); l = PackedLinear(torch.randn(8, 64), kernels=s.loaded); "
            "print(s.loaded, l.rows_kernel, l.onednn, s.note, sep='|')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PLAYGROUND_CACHE": str(tmp_path), **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("case", ["decode", "verify", "causal from a cache", "causal prompt", "masked batch",
                                  "many rows", "odd lengths"])
def test_cache_attention_is_scaled_dot_product_attention(case):
    torch.manual_seed(len(case))
    B, heads, kv_heads, head_dim, T, start = 1, 9, 3, 64, 6, 300
    mask, causal = None, False
    if case == "decode":
        T = 1
    elif case == "causal from a cache":
        causal = True
    elif case == "causal prompt":
        T, start, causal = 40, 0, True
    elif case == "many rows":
        T = 64
    elif case == "odd lengths":  # no multiple of four or eight keys, a head_dim past one pass of 64
        heads, kv_heads, head_dim, T, start = 4, 2, 72, 3, 14
    if case in ("verify", "masked batch", "many rows"):
        B = 2 if case == "masked batch" else 1
        mask = torch.rand(B, 1, T, start + T) > 0.4
    if case == "masked batch":
        mask[1, 0, 2] = False  # a row that sees no key
    q = torch.randn(B, heads, T, head_dim)
    keys, values = torch.randn(2, B, kv_heads, start + T + 5, head_dim)  # capacity past the keys used
    ours = torch.ops.playground.cache_attention(q, keys, values, start, mask, causal)
    visible = mask if not causal else torch.ones(T, start + T, dtype=torch.bool).tril(start)
    expected = F.scaled_dot_product_attention(q, keys[:, :, :start + T], values[:, :, :start + T], attn_mask=visible,
                                              enable_gqa=True)
    if case == "masked batch":
        assert torch.equal(ours[1, :, 2], torch.zeros(heads, head_dim))
        expected[1, :, 2] = 0
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("T", [6, 40])
def test_an_attention_rows_result_does_not_depend_on_the_rows_and_heads_beside_it(T):
    """The queries of a kv head read its keys together, each with its own arithmetic: a verify row
    is bit for bit that token decoded alone, and each head what it is alone."""
    torch.manual_seed(T)
    heads, kv_heads, head_dim, start = 9, 3, 64, 130
    q = torch.randn(1, heads, T, head_dim)
    keys, values = torch.randn(2, 1, kv_heads, start + T, head_dim)
    together = torch.ops.playground.cache_attention(q, keys, values, start, None, True)
    for t in range(T):
        for head in range(heads):
            g = slice(head // 3, head // 3 + 1)
            alone = torch.ops.playground.cache_attention(q[:, head:head + 1, t:t + 1], keys[:, g], values[:, g],
                                                         start + t, None, False)
            assert torch.equal(together[:, head:head + 1, t:t + 1], alone), (t, head)


@pytest.mark.pytorch_kernels
def test_without_our_kernels_the_model_runs_on_onednn(tmp_path):
    assert _status_in_a_fresh_process(tmp_path, PLAYGROUND_CPU_KERNELS="0") == (
        "False|False|True|PyTorch's kernels (PLAYGROUND_CPU_KERNELS=0)")


@pytest.mark.pytorch_kernels
def test_without_our_kernels_the_engine_drafts_the_same_tokens(engine):
    """On PyTorch's kernels (where oneDNN runs bf16 natively the drafters draft in bf16) every drafter
    emits the tokens our kernels emit."""
    prompt, drafters = "Write a Python function that reverses a string.", ("none", "eagle3", "eagle3.1")
    code = ("import json; from playground.model import kernels; from playground.engines.reference import ReferenceEngine; "
            "from playground.engines.request import GenerationRequest; e = ReferenceEngine.load(); "
            f"run = lambda d: [t for ev in e.generate(GenerationRequest(prompt={prompt!r}, drafter=d, max_tokens=40)) "
            "for t in ev.token_ids]; "
            "dtypes = sorted({str(e.drafter(d).dtype) for d in ('eagle3', 'eagle3.1')}); "
            f"print(json.dumps({{'kernels': kernels.status().loaded, 'dtypes': dtypes, 'tokens': {{d: run(d) for d in {drafters!r}}}}}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PLAYGROUND_CPU_KERNELS": "0"})
    assert done.returncode == 0, done.stderr
    ours = [t for ev in engine.generate(GenerationRequest(prompt=prompt, drafter="none", max_tokens=40)) for t in ev.token_ids]
    bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "kernels": False, "dtypes": ["torch.bfloat16" if bf16 else "torch.float32"], "tokens": {d: ours for d in drafters}}
    assert engine.drafter("eagle3.1").dtype == torch.float32   # ours: float32 drafters, bf16 weights read as saved


def fake_compiler(tmp_path, version: str, exit_status: int) -> tuple[Path, Path]:
    """A compiler that says `version`, logs each call of its own and exits with `exit_status`."""
    calls = tmp_path / f"calls-{exit_status}"
    script = tmp_path / f"cxx-{exit_status}"
    script.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "{version}" && exit 0\n'
                      f'echo "$@" >> {calls}\necho "fake: no such luck" >&2\nexit {exit_status}\n')
    script.chmod(0o755)
    return script, calls


def test_a_failed_build_is_one_warning_recorded_so_that_only_the_build_command_tries_again(tmp_path):
    compiler, calls = fake_compiler(tmp_path, "fake c++ 1.0", 1)
    code = ("from playground.model import kernels; s = kernels.status(); kernels.status(); "
            "print(s.loaded, s.note, sep='|')")
    env = {**os.environ, "PLAYGROUND_CACHE": str(tmp_path / "cache"), "CXX": str(compiler)}
    fresh = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    first = fresh()
    assert first.stdout.startswith("False|PyTorch's kernels (ours: the build failed: fake: no such luck)")
    assert first.stderr.count("do not run here") == 1, first.stderr   # one warning for the process
    built = len(calls.read_text().splitlines())
    assert built == len(kernels.SOURCES)   # the sources compiled at once; the failures stopped the link
    again = fresh()   # another process does not build again: it reads the failure
    assert again.stdout.startswith("False|PyTorch's kernels (ours: the build failed: fake: no such luck (an earlier "
                                   "build; `python -m playground.model.kernels` builds again)")
    assert len(calls.read_text().splitlines()) == built
    command = subprocess.run([sys.executable, "-m", "playground.model.kernels"], capture_output=True, text=True,
                             timeout=300, env=env)
    assert command.returncode == 1 and len(calls.read_text().splitlines()) == 2 * built   # it tries again
    assert not list((tmp_path / "cache").glob("kernels/*/*.so"))


def test_each_compiler_builds_a_library_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path))
    paths = set()
    for i, version in enumerate(("fake c++ 1.0", "fake c++ 2.0")):
        (tmp_path / f"compiler-{i}").mkdir()
        compiler, _ = fake_compiler(tmp_path / f"compiler-{i}", version, 0)
        monkeypatch.setenv("CXX", str(compiler))
        assert kernels._compiler() == (str(compiler), version)
        paths.add(kernels.library_path(version, kernels.vectors()))
    assert len(paths) == 2 and len({p.parent for p in paths}) == 1


def test_a_build_past_its_time_leaves_no_compiler_running(tmp_path):
    marker = f"{tmp_path}/never"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="longer than 1 s"):
        kernels._run([["sh", "-c", f"sleep 30 # {marker}"], ["sh", "-c", f"sleep 30 # {marker}"]], timeout_s=1)
    assert time.monotonic() - started < 10
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""


def test_the_kernels_share_pytorchs_openmp_runtime():
    """One OpenMP runtime in the process, so torch.set_num_threads governs our kernels' threads too."""
    assert kernels.status().loaded
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) == 1 and "torch" in runtimes.pop()


def test_the_weights_a_decode_step_streams_share_one_mapping_in_huge_pages(target):
    streamed = target.stack_weights + [target.lm_head.weight, target.norm.weight]
    bases = {w.untyped_storage().data_ptr() for w in streamed}
    assert len(bases) == 1 and all(w.data_ptr() % 64 == 0 for w in streamed)
    if "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text():
        pytest.skip("this kernel gives no transparent huge pages")
    base = bases.pop()
    mapping = _smaps_entry(base)
    assert int(mapping["AnonHugePages"].split()[0]) * 1024 >= 0.5 * sum(w.nbytes for w in streamed), mapping


def _smaps_entry(address: int) -> dict[str, str]:
    """/proc/self/smaps' fields of the mapping that holds address."""
    entry = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            entry = {} if low <= address < high else None
        elif entry is not None and ":" in line:
            key, value = line.split(":", 1)
            entry[key] = value.strip()
            if key == "VmFlags":
                return entry
    raise AssertionError(f"no mapping holds {address:#x}")


def _forward_both_ways(target, monkeypatch, ids, **kwargs):
    caches = []
    outputs = []
    for stack in (target.stack_weights, None):
        monkeypatch.setattr(target, "stack_weights", stack)
        cache = target.new_cache(128, batch=ids.shape[0])
        prefix = torch.full((ids.shape[0], 9), 42)
        target.forward(prefix, cache)
        outputs.append(target.forward(ids, cache, **kwargs))
        caches.append(cache)
    return outputs, caches


@pytest.mark.parametrize("case", ["decode", "verify", "tree", "padded batch", "a prompt's chunk after a cache"])
def test_the_one_call_stack_is_the_op_by_op_stack(target, monkeypatch, case):
    """Every case after 9 tokens in the cache; a chunk of a prompt is more rows than our attention takes
    (PyTorch's then, with the causal mask offset by the cache)."""
    assert target.stack_weights is not None
    ids = torch.tensor([[504, 3426, 314, 260, 1345, 28]])
    kwargs = {}
    if case == "decode":
        ids = ids[:, :1]
    elif case == "a prompt's chunk after a cache":
        ids = torch.randint(100, 40_000, (1, 70), generator=torch.Generator().manual_seed(0))
    elif case == "tree":  # a root with two children, the first with a child of its own
        depths = torch.tensor([0, 1, 1, 2, 2, 3])
        visible = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
                                [1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]], dtype=torch.bool)
        kwargs["tree"] = (depths, visible)
    elif case == "padded batch":
        ids = torch.cat([ids, ids.flip(1)])
        padding = torch.zeros(2, 128, dtype=torch.bool)
        padding[1, :3] = True
        kwargs["key_padding"] = padding
    (fused, plain), (fused_cache, plain_cache) = _forward_both_ways(target, monkeypatch, ids, **kwargs)
    torch.testing.assert_close(fused.logits, plain.logits, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fused.features, plain.features, rtol=1e-4, atol=1e-4)
    cached = 1e-4 if ids.shape[1] > 64 else 1e-5   # a prompt's chunk: PyTorch's attention, another order of sums
    torch.testing.assert_close(fused_cache.keys, plain_cache.keys, rtol=cached, atol=cached)
    torch.testing.assert_close(fused_cache.values, plain_cache.values, rtol=cached, atol=cached)
    assert fused_cache.length == plain_cache.length == 9 + ids.shape[1]


@pytest.mark.parametrize("drafter", ["eagle3", "eagle3.1"])
@pytest.mark.parametrize("rows", [1, 7, 70])
def test_the_one_call_fuse_is_the_drafters_op_by_op_fuse(engine, drafter, rows):
    """The target's features into the drafter's first input: fc_norm's norms (EAGLE 3.1) and fc; 70
    rows (a prompt) go to oneDNN's gemm."""
    model = engine.drafters.get(drafter)[0]
    assert model.kernels   # else fuse is the op-by-op fuse itself
    torch.manual_seed(rows)
    features = 4 * torch.randn(rows, 3 * model.config.target_hidden_size)
    chunks = features.chunk(3, dim=-1)
    normed = torch.cat([norm(x) for norm, x in zip(model.fc_norm, chunks)], -1) if model.fc_norm else features
    torch.testing.assert_close(model.fuse(features[None]), F.linear(normed, model.fc.weight.float())[None],
                               rtol=1e-4, atol=1e-4)   # oneDNN's gemm and MKL's sum in their own orders


def test_eagle_fuse_refuses_what_it_cannot_fuse():
    features, fc = torch.randn(2, 48), torch.randn(16, 48)
    with pytest.raises(RuntimeError, match="each norm a contiguous float32 weight of its chunk's width"):
        torch.ops.playground.eagle_fuse(features, [torch.ones(16), torch.ones(16), torch.ones(8)], fc, 1e-5)
    with pytest.raises(RuntimeError, match="a norm for each of the n equal chunks"):
        torch.ops.playground.eagle_fuse(features, [torch.ones(16)] * 5, fc, 1e-5)
    with pytest.raises(RuntimeError, match="a multiple of 8"):
        torch.ops.playground.eagle_fuse(torch.randn(2, 12), [], torch.randn(16, 12), 1e-5)


@pytest.mark.parametrize("rows", [2, 40])
def test_a_masked_draft_step_is_the_op_by_op_step(engine, rows):
    """A tree depth's step in one call (its mask; probes the mean of every row's) against the drafter's
    op-by-op step with the proposer's attention; 40 rows take more than one pass of queries."""
    from playground.engines.proposers import EagleProposer

    drafter = engine.drafters.get("eagle3.1")[0]
    torch.manual_seed(rows)
    committed, H = 50, drafter.config.hidden_size
    proposer = EagleProposer(drafter, engine.target.embed_tokens, committed + rows + 8)
    proposer._step(torch.randn(1, committed, H), torch.randn(1, committed, H), torch.arange(committed), committed, 0)
    proposer.cache.truncate(committed)
    mask = torch.rand(rows, committed + rows) > 0.5
    mask[:, :proposer.sink_tokens] = True   # the sink keys, seen by every row as in a tree
    mask[:, committed:] &= torch.ones(rows, rows, dtype=torch.bool).tril()
    mask[:, committed:].fill_diagonal_(True)
    hidden, embeds, positions = torch.randn(1, rows, H), torch.randn(1, rows, H), torch.full((rows,), committed)
    fused = proposer._kernel_step(hidden, embeds, positions, committed, committed, mask)
    plain = proposer._module_step(hidden, embeds, positions, committed, committed, mask)
    for ours, theirs in ((fused.normed, plain.normed), (fused.fed_back, plain.fed_back)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (fused.sink, fused.own) == pytest.approx((plain.sink, plain.own), rel=1e-4, abs=1e-6)
    assert 0 < fused.sink < 1 and 0 < fused.own < 1


@pytest.mark.parametrize("one_call", [True, False])
def test_sinks_are_the_committed_tokens_only_under_a_context_shorter_than_four(engine, one_call):
    """Two committed tokens, then a draft: the draft is no sink, so sink and own-draft masses never overlap."""
    from playground.engines.proposers import EagleProposer

    drafter = engine.drafters.get("eagle3")[0]
    torch.manual_seed(0)
    H = drafter.config.hidden_size
    proposer = EagleProposer(drafter, engine.target.embed_tokens, 16)
    step = proposer._kernel_step if one_call else proposer._module_step
    step(torch.randn(1, 2, H), torch.randn(1, 2, H), torch.arange(2), 2, 0)
    out = step(torch.randn(1, 1, H), torch.randn(1, 1, H), torch.tensor([2]), 2, 2)
    assert proposer.sink_tokens == 4 and 0 < out.own < 1
    assert out.sink + out.own == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("calls", ["a chain a call", "a step a call", "a tree's step a call"])
@pytest.mark.parametrize("drafter", ["eagle3", "eagle3.1"])
def test_the_one_call_draft_step_is_the_op_by_op_step(engine, monkeypatch, drafter, calls):
    from playground.engines.proposers import EagleProposer
    from playground.engines.request import GenerationRequest
    from playground.engines.tree import TreeShape
    from playground.model.drafter import Eagle3Drafter

    assert engine.drafters.get(drafter)[0].step_weights() is not None
    if calls == "a step a call":
        monkeypatch.setattr(EagleProposer, "chains_in_one_call", False)
    request = GenerationRequest(prompt="Name three rivers of Europe and say where each flows.", drafter=drafter,
                                k=5, max_tokens=40, tree=TreeShape() if calls == "a tree's step a call" else None)
    fused = list(engine.generate(request))
    monkeypatch.setattr(EagleProposer, "chains_in_one_call", False)
    monkeypatch.setattr(Eagle3Drafter, "step_weights", lambda self: None)
    plain = list(engine.generate(request))
    assert [e.token_ids for e in fused] == [e.token_ids for e in plain]
    assert sum(len(e.draft_ids) for e in fused) > 20
    assert any(e.tree_ids for e in fused) == (request.tree is not None)
    for a, b in zip(fused, plain):
        assert (a.draft_ids, a.tree_ids, a.tree_parents) == (b.draft_ids, b.tree_ids, b.tree_parents), a.step
        assert a.tree_probs == pytest.approx(b.tree_probs, rel=1e-4, abs=1e-6), a.step
        for field in ("draft_probs", "sink_attention", "self_attention", "hidden_norm"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-4, abs=1e-6), (a.step, field)


def test_the_chain_kernel_refuses_what_does_not_fit_and_takes_nan_as_torch_argmax_does(engine):
    """Every kernel checks the shapes of what it reads before reading it: a weight of the wrong shape, or a
    token outside the embedding, is an error naming what is wrong, never memory read out of bounds."""
    from playground.engines.proposers import EagleProposer

    drafter, embed = engine.drafter("eagle3.1"), engine.target.embed_tokens
    proposer = EagleProposer(drafter, embed, capacity=16)
    c, T, k = drafter.config, 3, 2
    cos, sin = drafter.rope(torch.arange(0, T + k - 1), torch.float32)
    head = drafter.lm_head.weight

    def chain(ids, weights, head=head):
        return torch.ops.playground.eagle_chain(
            torch.randn(T, c.hidden_size), ids, embed.weight, weights, head, proposer.draft_vocab_ids, cos, sin,
            proposer.cache.keys, proposer.cache.values, 0, k, c.rms_norm_eps, c.num_attention_heads, 4, c.norm_output)

    ids = torch.tensor([1, 2, 3])
    assert len(chain(ids, proposer.step_weights)[0]) == k
    with pytest.raises(RuntimeError, match="token 49152 is not in the embedding's 49152"):
        chain(torch.tensor([1, 2, embed.weight.shape[0]]), proposer.step_weights)
    swapped = list(proposer.step_weights)
    swapped[3], swapped[5] = swapped[5], swapped[3]   # k's projection where o's belongs
    with pytest.raises(RuntimeError, match="eagle_step: the weights must be the drafter's"):
        chain(ids, swapped)
    poisoned = head.float().clone()
    poisoned[7] = float("nan")   # a NaN logit at draft id 7: torch.argmax picks it
    drafts = chain(ids, proposer.step_weights, poisoned.to(head.dtype))[0]
    assert int(drafts[0]) == int(proposer.draft_vocab_ids[7])


def test_the_decoder_stack_refuses_a_layer_of_the_wrong_shape(target):
    weights = list(target.stack_weights)
    weights[1], weights[2] = weights[2], weights[1]   # o where qkv belongs
    cache = target.new_cache(8)
    cos, sin = target.rotary_emb(torch.zeros(1, 2, target.hidden_size), torch.arange(2)[None])
    with pytest.raises(RuntimeError, match="decoder_layers: layer 0's weights must be"):
        torch.ops.playground.decoder_layers(torch.randn(1, 2, target.hidden_size), weights, cos[0], sin[0], cache.keys,
                                            cache.values, 0, None, True, 1e-5, target.num_heads, [])


def test_every_attention_kernel_refuses_a_head_size_that_is_not_a_multiple_of_8(engine):
    """The kernels read keys eight floats at a time: a head_dim of 12 is refused at each entry, by name."""
    target, drafter = engine.target, engine.drafter("eagle3.1")
    keys = torch.zeros(1, 1, 8, 12)
    with pytest.raises(RuntimeError, match="cache_attention: .*head_dim a multiple of 8"):
        torch.ops.playground.cache_attention(torch.zeros(1, 2, 1, 12), keys, keys.clone(), 0, None, True)
    layers = len(target.stack_weights) // 6
    stack_keys, h = torch.zeros(layers, 1, 1, 8, 12), torch.zeros(1, 2, target.hidden_size)
    with pytest.raises(RuntimeError, match="decoder_layers: .*head_dim a multiple of 8"):
        torch.ops.playground.decoder_layers(h, list(target.stack_weights), torch.zeros(2, 12), torch.zeros(2, 12),
                                            stack_keys, stack_keys.clone(), 0, None, True, 1e-5, target.num_heads, [])
    hidden = torch.zeros(2, drafter.config.hidden_size)
    step_keys = torch.zeros(1, 1, 1, 8, 12)
    with pytest.raises(RuntimeError, match="eagle_step: head_dim a multiple of 8"):
        torch.ops.playground.eagle_step(hidden, hidden.clone(), drafter.step_weights(), torch.zeros(2, 12),
                                        torch.zeros(2, 12), step_keys, step_keys.clone(), 0, 1e-5,
                                        drafter.config.num_attention_heads, 4, 2, None)


def test_the_kernel_set_is_chosen_per_engine_in_one_process(engine):
    """`ReferenceEngine.load(kernels=...)` picks the kernels of that engine alone, as `bench kernels` runs two
    engines side by side: the process's default engine keeps ours, the other runs PyTorch's, and both draft
    the same tokens."""
    from playground.engines.reference import ReferenceEngine

    theirs = ReferenceEngine.load(kernels=False)
    assert engine.target.stack_weights is not None and theirs.target.stack_weights is None
    assert theirs.drafter("eagle3.1").step_weights() is None and engine.drafter("eagle3.1").step_weights() is not None
    request = GenerationRequest(prompt="Write a Python function that reverses a string.", drafter="eagle3.1",
                                max_tokens=24)
    tokens = lambda e: [t for event in e.generate(request) for t in event.token_ids]
    assert tokens(theirs) == tokens(engine)
    assert engine.target.stack_weights is not None   # loading the other changed nothing of this one
