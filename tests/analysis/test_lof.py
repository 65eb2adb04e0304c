import warnings

import numpy as np
import pytest
from sklearn.neighbors import LocalOutlierFactor

from skh.analysis.lof import batched_lof, fit_lof, score_lof
from skh.errors import ConfigError


def _sklearn(train: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores, nof = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k > n_samples - 1 warns; the clamp is what we compare
        for tr, q in zip(train, query, strict=True):
            m = LocalOutlierFactor(n_neighbors=k, novelty=True).fit(tr)
            scores.append(m.score_samples(q))
            nof.append(m.negative_outlier_factor_)
    return np.array(scores), np.array(nof)


@pytest.mark.parametrize(
    ("n_train", "k"), [(10, 5), (10, 1), (10, 9), (10, 20), (6, 3), (2, 1), (25, 7)]
)
def test_equals_sklearn_novelty_scores_on_random_inputs(n_train, k):
    rng = np.random.default_rng(n_train * 100 + k)
    train = rng.normal(14.0, rng.uniform(0.1, 3.0, (20, 1, 1)), (20, n_train, 7))
    query = rng.normal(14.0, 2.0, (20, 3, 7))
    ours, ours_nof = batched_lof(train, query, k, return_train=True)
    ref, ref_nof = _sklearn(train, query, k)
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ours_nof, ref_nof, rtol=1e-9, atol=1e-9)


def test_equals_sklearn_with_duplicate_windows():
    # identical windows are the common exact tie (a quiet pair); every duplicate has the same
    # k-distance, so the score does not depend on which duplicate is a neighbour
    rng = np.random.default_rng(5)
    train = rng.normal(14.0, 0.5, (15, 10, 7))
    train[:, 3] = train[:, 1]
    train[:, 7] = train[:, 1]
    train[:5, :] = train[:5, :1]  # all ten windows identical
    query = np.concatenate([train[:, :1], rng.normal(14.0, 0.5, (15, 2, 7))], axis=1)
    np.testing.assert_allclose(
        batched_lof(train, query, 5), _sklearn(train, query, 5)[0], rtol=1e-9, atol=1e-9
    )


def test_single_query_shape_and_fit_reuse():
    rng = np.random.default_rng(1)
    train = rng.normal(size=(50, 10, 7))
    query = rng.normal(size=(50, 7))
    fit = fit_lof(train, 5)
    one = score_lof(train, fit, query)
    assert one.shape == (50,)
    np.testing.assert_array_equal(one, batched_lof(train, query, 5))
    np.testing.assert_array_equal(one, score_lof(train, fit, query[:, None, :])[:, 0])


def test_float32_storage_scores_like_float64_of_the_same_values():
    rng = np.random.default_rng(2)
    train = rng.normal(14.0, 0.5, (20, 10, 7)).astype(np.float32)
    query = rng.normal(14.0, 0.5, (20, 7)).astype(np.float32)
    np.testing.assert_allclose(
        batched_lof(train, query, 5),
        _sklearn(train.astype(float), query[:, None].astype(float), 5)[0][:, 0],
        rtol=1e-9,
    )


def test_an_outlier_scores_far_below_an_inlier():
    rng = np.random.default_rng(3)
    train = rng.normal(14.0, 0.3, (1, 10, 7))
    s = batched_lof(train, np.stack([train[0, 0] + 0.01, train[0, 0] + 30.0])[None], 5)[0]
    assert s[0] > -1.5 and s[1] < -10


@pytest.mark.parametrize(
    ("train", "query", "k", "msg"),
    [
        (np.zeros((3, 1, 7)), np.zeros((3, 7)), 5, "'train'"),
        (np.zeros((3, 10)), np.zeros((3, 7)), 5, "'train'"),
        (np.zeros((3, 10, 7)), np.zeros((4, 7)), 5, "'query'"),
        (np.zeros((3, 10, 7)), np.zeros((3, 6)), 5, "'query'"),
        (np.zeros((3, 10, 7)), np.zeros((3, 7)), 0, "'n_neighbors'"),
        (np.zeros((3, 10, 7)), np.zeros((3, 7)), True, "'n_neighbors'"),
    ],
)
def test_rejects_bad_shapes_and_k(train, query, k, msg):
    with pytest.raises(ConfigError, match=msg):
        batched_lof(train, query, k)
