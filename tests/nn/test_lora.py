import pytest
import torch
from safetensors.torch import load_file

from attnkit.errors import AttnkitError
from attnkit.generation import generate
from attnkit.nn import Linear, LoRALinear, apply_lora, lora_state_dict, merge_lora
from attnkit.run import RunFolder, load_pretrained
from attnkit.train import Trainer
from attnkit.train.checkpoint import load_checkpoint
from attnkit.train.run_config import TrainSection
from tests.helpers import randomise_updates, tiny_model, translation_batches


def test_lora_linear_computes_the_low_rank_update():
    base = Linear(6, 5)
    layer = LoRALinear(base, rank=2, alpha=3.0)
    randomise_updates(layer)
    x = torch.randn(4, 6)
    a, b = layer.lora_A.detach(), layer.lora_B.detach()
    expected = x @ base.weight.T + base.bias + (3.0 / 2) * (x @ a.T) @ b.T
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-6)
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["lora_A", "lora_B"]


def test_a_new_adapter_leaves_the_model_unchanged_and_only_it_trains():
    model = tiny_model().eval()
    src, tgt = torch.randint(5, 24, (2, 6)), torch.randint(5, 24, (2, 5))
    before = model(src, tgt).logits
    adapted = apply_lora(model, rank=2, alpha=4.0)
    # One encoder layer (self-attention) and one decoder layer (self- and cross-attention).
    assert sorted(name.rsplit(".", 1)[1] for name in adapted) == sorted(
        ["qkv_proj", "out_proj"] * 2 + ["q_proj", "kv_proj", "out_proj"]
    )
    torch.testing.assert_close(model(src, tgt).logits, before, atol=0, rtol=0)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    expected = sum(
        2 * (m.base.in_features + m.base.out_features)
        for m in model.modules()
        if isinstance(m, LoRALinear)
    )
    assert sum(trainable.values()) == expected


def test_merge_gives_the_same_outputs_and_unmerge_restores_the_weights():
    model = tiny_model(shape="decoder").eval()
    apply_lora(model, rank=3, alpha=6.0, targets=("*qkv_proj", "*w_1", "*w_2"))
    randomise_updates(model)
    ids = torch.randint(5, 24, (2, 7))
    unmerged = model(ids).logits
    layer = model.decoder.blocks[0].ff.w_1
    weight = layer.base.weight.clone()
    layer.merge()
    torch.testing.assert_close(model(ids).logits, unmerged, atol=1e-5, rtol=1e-5)
    layer.unmerge()
    torch.testing.assert_close(layer.base.weight, weight, atol=1e-6, rtol=0)
    plain_names = set(tiny_model(shape="decoder").state_dict())
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert set(model.state_dict()) == plain_names
    torch.testing.assert_close(model(ids).logits, unmerged, atol=1e-5, rtol=1e-5)


def test_cached_decoding_of_an_adapted_model_equals_the_merged_model():
    model = tiny_model(shape="decoder").eval()
    apply_lora(model, rank=2, targets=("*_proj", "*w_2"))
    randomise_updates(model)
    prompt = torch.randint(5, 24, (2, 4))
    adapted = generate(model, prompt, max_new_tokens=10, eos_token_id=()).sequences
    merged = generate(merge_lora(model), prompt, max_new_tokens=10, eos_token_id=()).sequences
    assert torch.equal(adapted, merged)


def test_bad_lora_requests_are_refused_in_one_sentence():
    with pytest.raises(AttnkitError, match="no linear layer matches"):
        apply_lora(tiny_model(), targets=("*nothing*",))
    with pytest.raises(AttnkitError, match="output head"):
        apply_lora(tiny_model(shape="decoder"), targets=("head",))
    with pytest.raises(AttnkitError, match="rank must be at least 1"):
        apply_lora(tiny_model(), rank=0)
    model = tiny_model()
    apply_lora(model)
    with pytest.raises(AttnkitError, match="already has LoRA"):
        apply_lora(model)


def test_training_moves_only_the_adapters_and_the_run_folder_holds_the_merged_model(tmp_path):
    model = tiny_model()
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    apply_lora(model, rank=2, alpha=4.0, targets=("*_proj", "*w_1", "*w_2"))
    settings = TrainSection(
        out_dir=str(tmp_path), steps=6, lr=1e-2, warmup=1, save_every=2, keep_last=3,
        average_last=2, threads=1, log_every=2, device="cpu",
    )  # fmt: skip
    result = Trainer(model, translation_batches(3), train=settings).fit()
    assert result.step == 6
    for name, tensor in model.state_dict().items():
        base_name = name.replace(".base.", ".")
        if base_name in frozen:
            assert torch.equal(tensor, frozen[base_name]), name
    assert any(t.abs().sum() > 0 for n, t in lora_state_dict(model).items() if "lora_B" in n)

    # model.safetensors is the mean of the last two checkpoints, each merged first.
    merged_steps = []
    folder = RunFolder(tmp_path)
    for step in folder.saved_steps()[-2:]:
        state = load_file(str(folder.step_weights(step)))
        adapted = tiny_model()
        apply_lora(adapted, rank=2, alpha=4.0, targets=("*_proj", "*w_1", "*w_2"))
        adapted.load_state_dict(state, strict=False)
        merged_steps.append(merge_lora(adapted).state_dict())
    loaded = load_pretrained(tmp_path)
    for name, tensor in loaded.state_dict().items():
        mean = (merged_steps[0][name] + merged_steps[1][name]) / 2
        torch.testing.assert_close(tensor, mean, atol=1e-6, rtol=1e-6)

    # Step checkpoints keep the factors apart, so an adapted model resumes from them.
    again = tiny_model()
    apply_lora(again, rank=2, alpha=4.0, targets=("*_proj", "*w_1", "*w_2"))
    assert load_checkpoint(RunFolder(tmp_path), again)["step"] == 6
    for name, tensor in again.state_dict().items():
        torch.testing.assert_close(tensor, model.state_dict()[name], atol=0, rtol=0)
