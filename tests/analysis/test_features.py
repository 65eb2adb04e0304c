import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from skh.analysis.features import FEATURE_NAMES, window_features
from skh.errors import ConfigError


def _reference(row: np.ndarray) -> list[float]:
    return [*np.percentile(row, [25, 50, 75]), row.min(), row.mean(), row.std(), row.max()]


def test_names_are_the_papers_seven():
    assert FEATURE_NAMES == ("p25", "p50", "p75", "min", "mean", "std", "max")


def test_matches_numpy_per_row_on_random_masks():
    rng = np.random.default_rng(0)
    values = rng.lognormal(2.6, 0.1, (300, 48))
    valid = rng.random((300, 48)) < rng.random((300, 1))
    valid[:, 0] = True  # no empty row here
    feats, counts = window_features(values, valid)
    ref = np.array([_reference(values[i][valid[i]]) for i in range(300)])
    np.testing.assert_allclose(feats, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(counts, valid.sum(axis=1))


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64, st.tuples(st.integers(1, 6), st.integers(1, 12)), elements=st.floats(0.1, 1e4)
    ),
    st.data(),
)
def test_matches_numpy_on_any_small_input(values, data):
    valid = data.draw(arrays(bool, values.shape))
    feats, counts = window_features(values, valid)
    for i in range(values.shape[0]):
        if counts[i] == 0:
            assert np.isnan(feats[i]).all()
        else:
            np.testing.assert_allclose(
                feats[i], _reference(values[i][valid[i]]), rtol=1e-9, atol=1e-9
            )


def test_empty_rows_are_nan_and_others_unaffected():
    values = np.array([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]])
    valid = np.array([[False, False, False], [True, True, True]])
    feats, counts = window_features(values, valid)
    assert np.isnan(feats[0]).all()
    assert counts.tolist() == [0, 3]
    assert feats[1].tolist() == pytest.approx([5.5, 6.0, 6.5, 5.0, 6.0, np.std([5, 6, 7]), 7.0])


def test_rejects_mismatched_shapes():
    with pytest.raises(ConfigError, match="'values' and 'valid'"):
        window_features(np.zeros((2, 3)), np.zeros((2, 4), bool))
