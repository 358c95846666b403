import torch

from playground.engines.text import IncrementalDetokenizer
from playground.model.target import Target, aux_layer_ids


def test_forward_matches_transformers_and_taps_aux_layers(target):
    ids = torch.tensor([target.tokenizer("The quick brown fox jumps over the lazy dog. " * 3).input_ids])
    cache = target.new_cache(ids.shape[1] + 8)
    split = ids.shape[1] - 5
    first = target.forward(ids[:, :split], cache)
    second = target.forward(ids[:, split:], cache)  # a verify-style block over a cached prefix
    with torch.inference_mode():
        ref = target.reference()(ids, output_hidden_states=True)
    logits = torch.cat([first.logits, second.logits], 1)
    torch.testing.assert_close(logits, ref.logits, rtol=1e-4, atol=2e-4)
    features = torch.cat([first.features, second.features], 1)
    expected = torch.cat([ref.hidden_states[i] for i in aux_layer_ids(30)], -1)
    # the packed projections sum in another order than transformers' own: fp32 rounding noise
    torch.testing.assert_close(features, expected, rtol=1e-4, atol=5e-4)
    assert target.aux_layers == (2, 15, 27)


def test_rollback_reuses_the_cache(target):
    """A rejected draft is rolled back by moving the cache's length: the same storage, written over, and
    what follows is what a fresh cache gives."""
    ids = torch.tensor([target.tokenizer("Speculative decoding rolls back rejected drafts.").input_ids])
    cache = target.new_cache(64)
    target.forward(ids, cache)
    length, storage = cache.length, (cache.keys.data_ptr(), cache.values.data_ptr())
    wrong = target.forward(torch.tensor([[100, 200, 300]]), cache)
    cache.truncate(length)
    right = target.forward(torch.tensor([[100, 400]]), cache)
    assert cache.length == length + 2 and (cache.keys.data_ptr(), cache.values.data_ptr()) == storage
    fresh = target.forward(torch.cat([ids, torch.tensor([[100, 400]])], dim=1), target.new_cache(64))
    torch.testing.assert_close(right.logits[0], fresh.logits[0, -2:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(right.logits[0, 0], wrong.logits[0, 0], rtol=1e-4, atol=1e-4)


def test_incremental_text_joins_to_the_full_decode(target):
    tok = target.tokenizer
    text = "Emoji 🌊🐙, accents déjà vu, code:\n    def f(x):\n\treturn x  # done\n中文 also."
    ids = tok(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.add(t) for t in ids) == tok.decode(ids)


def test_converted_folder_reloads_the_same_model(target, tmp_path):
    """The float32 folder converted from the GGUF computes what the target computes: the layers' states bit
    for bit, the logits within the rounding of another summation order (on the GGUF's blocks the head's
    Q8_0 rows are summed in two chains), and so the same greedy tokens."""
    from playground.model.target import embedded_target_folder

    folder = embedded_target_folder()
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    reloaded = Target.load(str(folder))
    ids = torch.tensor([[1, 504, 3426, 314, 260]])
    ours, theirs = target.forward(ids, target.new_cache(8)), reloaded.forward(ids, reloaded.new_cache(8))
    assert torch.equal(theirs.features, ours.features) and torch.equal(theirs.final_hidden, ours.final_hidden)
    assert torch.allclose(theirs.logits, ours.logits, rtol=0, atol=1e-4)
    assert torch.equal(theirs.logits.argmax(-1), ours.logits.argmax(-1))


def test_a_conversion_that_finishes_second_keeps_the_folder_written_first(tmp_path):
    """Two processes starting at once both convert; the one that finishes second must not delete the
    folder the first may already be reading."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from playground.model.target import embedded_target_folder, write_safetensors_folder

    out = tmp_path / "target"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"written first")
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    write_safetensors_folder(LlamaForCausalLM(config), AutoTokenizer.from_pretrained(embedded_target_folder()), out)
    assert (out / "model.safetensors").read_bytes() == b"written first"
    assert list(tmp_path.iterdir()) == [out]
