"""Built-in models on synthetic batches of each kind, the batch contract, and user models."""

from __future__ import annotations

import pytest
import torch

from packdata.bench.models import (
    BUILTINS,
    build_model,
    default_model,
    describe_batch,
    loss_of,
    prepare_inputs,
    split_batch,
)
from packdata.errors import BenchError

IMAGES = (torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 1, 2, 9]))
POINTS = (torch.randn(4, 256, 4), torch.tensor([3, 1, 0, 2]))
IDS = torch.randint(0, 50_000, (4, 17))
MASK = torch.ones(4, 17, dtype=torch.int64)
MASK[1, 9:] = 0
TEXT = (IDS, MASK)


@pytest.mark.parametrize("name,kind,batch", [
    ("small-cnn", "image", IMAGES), ("resnet18", "image", IMAGES),
    ("pointnet", "pointcloud", POINTS), ("transformer", "text", TEXT),
])
def test_builtin_trains_on_its_kind(name, kind, batch):
    _, model = build_model(name, kind, batch, num_classes=10)
    inputs, target = split_batch(batch)
    out = model(*prepare_inputs(inputs))
    assert out.shape == (4, 10)
    loss = loss_of(out, target)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_pointnet_ignores_point_order():
    _, model = build_model("pointnet", "pointcloud", POINTS, 10)
    model.eval()
    perm = torch.randperm(256)
    assert torch.allclose(model(POINTS[0]), model(POINTS[0][:, perm]), atol=1e-5)


def test_transformer_ignores_padding():
    _, model = build_model("transformer", "text", TEXT, 5)
    model.eval()
    changed = IDS.clone()
    changed[1, 9:] = 7  # only padded positions differ
    assert torch.allclose(model(IDS, MASK)[1], model(changed, MASK)[1], atol=1e-5)
    changed[1, 0] = (IDS[1, 0] + 1) % 50_000  # a real token differs: the output must move
    assert not torch.allclose(model(IDS, MASK)[1], model(changed, MASK)[1], atol=1e-5)


def test_resnet18_has_cifar_shape():
    _, model = build_model("resnet18", "image", IMAGES, 10)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(11.17e6, rel=0.01)
    assert model.stem[0].kernel_size == (3, 3)


def test_split_batch():
    assert split_batch(IMAGES)[1] is IMAGES[1]
    inputs, target = split_batch(TEXT)  # a 2-D mask is an input, not a target
    assert target is None and len(inputs) == 2
    assert split_batch(IMAGES[0]) == ((IMAGES[0],), None)
    assert prepare_inputs(IMAGES[:1])[0].dtype == torch.float32
    assert float(prepare_inputs(IMAGES[:1])[0].max()) <= 1.0


def test_defaults_and_kind_mismatch():
    assert default_model("image", torch.device("cpu")) == "small-cnn"
    assert default_model("image", torch.device("cuda")) == "resnet18"
    assert default_model("text", torch.device("cpu")) == "transformer"
    with pytest.raises(BenchError, match="is for image samples"):
        build_model("resnet18", "pointcloud", POINTS, 10)
    with pytest.raises(BenchError, match="no built-in model"):
        default_model("audio", torch.device("cpu"))
    assert set(BUILTINS) == {"small-cnn", "resnet18", "fast-cifar", "pointnet", "transformer"}


def test_describe_batch():
    assert describe_batch(IMAGES) == "(uint8 4×3×32×32, int64 4)"
    assert describe_batch(([b"x"], torch.tensor(1))) == "(list of 1, int64 scalar)"


def test_user_model_from_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def net(num_classes):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3*32*32, num_classes))\n"
        "def bare():\n"
        "    return torch.nn.Flatten()\n"
        "def notamodel():\n"
        "    return 3\n")
    name, model = build_model(f"{tmp_path / 'mymodels.py'}:net", "image", IMAGES, 7)
    assert model[1].out_features == 7
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(build_model("mymodels:bare", "image", IMAGES, 7)[1], torch.nn.Flatten)
    with pytest.raises(BenchError, match="returned int"):
        build_model("mymodels:notamodel", "image", IMAGES, 7)
    with pytest.raises(BenchError, match="has no attribute 'nope'"):
        build_model("mymodels:nope", "image", IMAGES, 7)
    with pytest.raises(BenchError, match="cannot import 'no_such_module_xyz'"):
        build_model("no_such_module_xyz:f", "image", IMAGES, 7)
    with pytest.raises(BenchError, match="expected a built-in"):
        build_model("vgg16", "image", IMAGES, 7)
