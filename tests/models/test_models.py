"""The engine's models: shapes, memorization of one batch, activation checkpointing against the
plain model (gradients, buffers, state_dict keys), gpt's attention path, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from fasttrain.errors import UserError
from fasttrain.models import (
    MODEL_KINDS,
    MODELS,
    Checkpointed,
    apply_activation_checkpointing,
    build_model,
    param_count,
)

MNIST, CIFAR = (1, 28, 28), (3, 32, 32)
# Each model on its usual input: (name, in_shape, num_classes, parameters as the docstrings say).
USUAL = [
    ("logreg", MNIST, 10, 7_850),
    ("mlp", MNIST, 10, 269_322),
    ("cnn", MNIST, 10, 467_818),
    ("cnn", CIFAR, 10, 591_274),
    ("resnet", CIFAR, 10, 308_650),
    ("gpt", (128,), 65, 818_048),
]
IDS = [f"{name}-{'x'.join(map(str, shape))}" for name, shape, _, _ in USUAL]


def batch(name: str, in_shape, num_classes: int, n: int, seed: int = 1):
    """(input, target): images in [0, 1] with labels, or a token sequence and its next tokens."""
    g = torch.Generator().manual_seed(seed)
    if MODEL_KINDS[name] == "language":
        seq = torch.randint(0, num_classes, (n, in_shape[0] + 1), generator=g)
        return seq[:, :-1], seq[:, 1:]
    return torch.rand(n, *in_shape, generator=g), torch.randint(0, num_classes, (n,), generator=g)


def loss_of(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), target.flatten())


def test_registry_is_consistent():
    assert set(MODEL_KINDS) == set(MODELS)
    assert {k for k in MODEL_KINDS.values()} == {"classification", "language"}
    assert [m for m in MODELS if MODEL_KINDS[m] == "language"] == ["gpt"]


@pytest.mark.parametrize("name,in_shape,num_classes,params", USUAL, ids=IDS)
def test_shape_dtype_and_size(name, in_shape, num_classes, params):
    torch.manual_seed(0)
    model = build_model(name, in_shape=in_shape, num_classes=num_classes)
    x, _ = batch(name, in_shape, num_classes, n=3)
    out = model(x)
    want = (3, in_shape[0], num_classes) if name == "gpt" else (3, num_classes)
    assert out.shape == want and out.dtype == torch.float32
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) > 0
    assert param_count(model) == params, "update the count in the model's docstring"


def test_resnet_is_adaptive_to_image_size():
    model = build_model("resnet", in_shape=MNIST, num_classes=10)
    assert model(torch.rand(2, *MNIST)).shape == (2, 10)


def test_gpt_accepts_shorter_sequences():
    model = build_model("gpt", in_shape=(32,), num_classes=65, n_layer=1)
    assert model(torch.randint(0, 65, (2, 5))).shape == (2, 5, 65)


@pytest.mark.parametrize("name,in_shape,num_classes,params", USUAL, ids=IDS)
def test_memorizes_one_batch(name, in_shape, num_classes, params):
    torch.manual_seed(0)
    language = MODEL_KINDS[name] == "language"
    if language:
        in_shape = (32,)  # 4 sequences of 32 tokens
    model = build_model(name, in_shape=in_shape, num_classes=num_classes)
    x, y = batch(name, in_shape, num_classes, n=4 if language else 16)
    target = 0.1 if language else 0.05
    opt = torch.optim.Adam(model.parameters(), lr=3e-3 if name in ("resnet", "gpt") else 1e-3)
    for _ in range(300):
        loss = loss_of(model(x), y)
        if loss.item() < target:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < target, f"{name} did not memorize one batch: loss {loss.item():.4f}"


# -- activation checkpointing -------------------------------------------------------------------

# Small sizes: equivalence does not depend on width, and gpt gets dropout so that the RNG replay
# in the recomputation is exercised too.
SMALL = {
    "logreg": (MNIST, 10, {}),
    "mlp": (MNIST, 10, {"hidden": 32}),
    "cnn": (CIFAR, 10, {"channels": (8, 16), "hidden": 16}),
    "resnet": (CIFAR, 10, {"width": 8}),
    "gpt": ((16,), 65, {"n_layer": 2, "n_embd": 32, "dropout": 0.1}),
}


def small(name: str) -> torch.nn.Module:
    in_shape, num_classes, kwargs = SMALL[name]
    torch.manual_seed(0)
    return build_model(name, in_shape=in_shape, num_classes=num_classes, **kwargs).train()


def count_block_calls(model: torch.nn.Module) -> list[int]:
    """Per block, how often its forward starts (a pre-hook: checkpoint's recomputation may stop
    before a block's last op, so a post-hook could miss it)."""
    counts = [0] * len(model.blocks)
    for i, block in enumerate(model.blocks):
        inner = block.inner if isinstance(block, Checkpointed) else block

        def hook(module, args, i=i):
            counts[i] += 1

        inner.register_forward_pre_hook(hook)
    return counts


@pytest.mark.parametrize("name", MODELS)
def test_checkpointing_keeps_gradients_and_recomputes(name, monkeypatch):
    plain = small(name)
    ckpt = apply_activation_checkpointing(copy.deepcopy(plain))
    in_shape, num_classes, _ = SMALL[name]
    x, y = batch(name, in_shape, num_classes, n=4)

    calls = []
    real = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    plain_calls, ckpt_calls = count_block_calls(plain), count_block_calls(ckpt)
    for model in (plain, ckpt):
        torch.manual_seed(1)  # same dropout masks for both
        loss_of(model(x), y).backward()

    assert len(calls) == len(ckpt.blocks), "every block goes through torch.utils.checkpoint"
    assert plain_calls == [1] * len(plain.blocks)
    assert ckpt_calls == [2] * len(ckpt.blocks), "forward, then the recomputation in backward"
    named = dict(plain.named_parameters())
    for key, p in ckpt.named_parameters():
        ref = named[key.replace("._checkpoint_wrapped_module.", ".")]
        torch.testing.assert_close(p.grad, ref.grad, atol=1e-6, rtol=0, msg=f"grad of {key}")
    # Buffers too: BatchNorm's running statistics are updated once, not again in recomputation.
    for (key, a), b in zip(plain.state_dict().items(), ckpt.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, atol=0, rtol=0, msg=f"buffer {key}")


@pytest.mark.parametrize("name", MODELS)
def test_checkpointing_keeps_state_dict_keys(name):
    plain = small(name)
    ckpt = apply_activation_checkpointing(copy.deepcopy(plain))
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    assert all(isinstance(b, Checkpointed) for b in ckpt.blocks)
    # Checkpoints load either way, strictly.
    fresh_plain, fresh_ckpt = small(name), apply_activation_checkpointing(small(name))
    with torch.no_grad():
        for p in ckpt.parameters():
            p.add_(1.0)  # distinguishable from the fresh models' weights
    fresh_plain.load_state_dict(ckpt.state_dict())
    fresh_ckpt.load_state_dict(ckpt.state_dict())
    for model in (fresh_plain, fresh_ckpt):
        for (key, a), b in zip(ckpt.state_dict().items(), model.state_dict().values(),
                               strict=True):
            assert torch.equal(a, b), key
    fresh_ckpt.load_state_dict(plain.state_dict())


def test_checkpointing_twice_wraps_once():
    model = apply_activation_checkpointing(apply_activation_checkpointing(small("mlp")))
    assert not any(isinstance(b.inner, Checkpointed) for b in model.blocks)


@pytest.mark.parametrize("where", ["layers", "model.layers", "transformer.h"])
def test_checkpointing_finds_hugging_face_style_blocks(where):
    # A Hugging Face-shaped model (Llama's model.layers, GPT-2's transformer.h) was refused
    # unless its blocks were named in Python: the CLI had no way to name them.
    blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
    model = torch.nn.Module()
    parent = model
    *path, last = where.split(".")
    for part in path:
        parent.register_module(part, torch.nn.Module())
        parent = parent.get_submodule(part)
    parent.register_module(last, blocks)
    model.head = torch.nn.Linear(4, 2)
    apply_activation_checkpointing(model)
    assert all(isinstance(b, Checkpointed) for b in model.get_submodule(where))
    assert not isinstance(model.head, Checkpointed)


def test_checkpointing_needs_blocks():
    with pytest.raises(UserError, match="blocks"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2))


# -- gpt -----------------------------------------------------------------------------------------


def test_gpt_attention_goes_through_sdpa_causally(monkeypatch):
    model = build_model("gpt", in_shape=(16,), num_classes=65, n_layer=3)
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    model(torch.randint(0, 65, (2, 16)))
    assert calls == [True] * 3


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = build_model("gpt", in_shape=(16,), num_classes=65, n_layer=2).eval()
    x = torch.randint(0, 65, (2, 16))
    t = 6
    changed = x.clone()
    changed[:, t + 1 :] = torch.randint(0, 65, (2, 16 - t - 1))
    a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=0, rtol=0)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :]), "later positions see their tokens"


def test_gpt_init_and_tied_head():
    torch.manual_seed(0)
    model = build_model("gpt", in_shape=(128,), num_classes=65)  # 4 layers
    block = model.blocks[0]
    assert abs(block.mlp.fc.weight.std().item() - 0.02) < 0.002
    assert abs(block.mlp.proj.weight.std().item() - 0.02 / 8**0.5) < 0.0007
    assert abs(block.attn.proj.weight.std().item() - 0.02 / 8**0.5) < 0.0007
    assert torch.count_nonzero(block.attn.qkv.bias) == 0
    # The head is the token embedding: its gradient gets the output layer's contribution too.
    x = torch.randint(0, 65, (1, 8))
    model(x)[0, -1, 3].backward()
    assert model.wte.weight.grad[3].abs().sum() > 0 and not any("head" in k
                                                                for k in model.state_dict())


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,in_shape,kwargs,match",
    [
        ("transformer", MNIST, {}, "unknown model 'transformer'; choose one of: logreg, mlp"),
        ("mlp", MNIST, {"width": 3}, "unknown option width for model mlp; valid: hidden, depth"),
        ("gpt", MNIST, {}, "use --data tinyshakespeare"),
        ("resnet", (128,), {}, "needs in_shape \\(C, H, W\\)"),
        ("resnet", (3, 32), {}, "needs in_shape \\(C, H, W\\)"),
        ("logreg", (1, 0, 28), {}, "in_shape\\[1\\] must be a positive integer"),
        ("mlp", MNIST, {"hidden": 0}, "hidden must be a positive integer"),
        ("cnn", (1, 2, 2), {}, "need images of at least 4×4"),
        ("cnn", MNIST, {"channels": ()}, "channels must be a non-empty list"),
        ("gpt", (16,), {"n_embd": 30}, "not divisible by n_head"),
        ("gpt", (16,), {"dropout": 1.0}, "dropout must be a number in \\[0, 1\\)"),
    ],
)
def test_bad_input_is_a_one_line_user_error(name, in_shape, kwargs, match):
    with pytest.raises(UserError, match=match) as info:
        build_model(name, in_shape=in_shape, num_classes=10, **kwargs)
    assert "\n" not in str(info.value)


def test_num_classes_must_be_positive():
    with pytest.raises(UserError, match="num_classes"):
        build_model("logreg", in_shape=MNIST, num_classes=0)
