"""The synthetic stand-in is deterministic, MNIST-shaped, and learnable but not trivially so."""

import numpy as np

from fasttrain.data import synthetic_dataset


def test_same_seed_same_bytes_other_seed_other_bytes():
    a, b, c = (synthetic_dataset(seed, n_train=1000, n_test=200) for seed in (1, 1, 2))
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert getattr(a, field).tobytes() == getattr(b, field).tobytes()
    assert a.train_x.tobytes() != c.train_x.tobytes()


def test_shapes_dtypes_and_labels_like_mnist():
    ds = synthetic_dataset(0)
    assert ds.train_x.shape == (60000, 28, 28) and ds.test_x.shape == (10000, 28, 28)
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    for a in (ds.train_x, ds.train_y, ds.test_x, ds.test_y):
        assert a.dtype == np.uint8 and a.flags.c_contiguous and not a.flags.writeable
    counts = np.bincount(ds.train_y, minlength=ds.num_classes)
    assert ds.num_classes == 10 and len(counts) == 10 and counts.min() > 5400  # balanced-ish
    assert ds.train_x.min() == 0 and ds.train_x.max() == 255  # uses the whole grey range
    assert ds.name == "synthetic" and ds.synthetic and ds.source == "synthetic (seed 0)"


def test_learnable_by_a_linear_model_but_not_perfectly():
    ds = synthetic_dataset(0, n_train=5000, n_test=2000)

    def features(x: np.ndarray) -> np.ndarray:  # [N, 785]: pixels in [0, 1] and a bias
        return np.c_[x.reshape(len(x), -1) / 255.0, np.ones(len(x))]

    # Closed-form ridge regression onto one-hot labels: a linear classifier without training loop.
    x = features(ds.train_x)
    w = np.linalg.solve(x.T @ x + np.eye(x.shape[1]), x.T @ np.eye(10)[ds.train_y])
    accuracy = np.mean((features(ds.test_x) @ w).argmax(1) == ds.test_y)
    assert 0.7 < accuracy < 0.99, accuracy
