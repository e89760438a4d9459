"""SensitiveAttribute: substitution for numeric, one-hot and custom attributes; clear errors."""

import numpy as np
import pytest
import torch

from lightning_privacy.attributes import (
    CHECK_MIN_VALUES,
    SensitiveAttribute,
    check_candidates,
    observed_values,
)
from lightning_privacy.data.datamodule import AdultDataModule


@pytest.fixture(scope="module")
def adult():
    dm = AdultDataModule()
    dm.setup("fit")
    return dm


def test_numeric_expand_writes_encoded_values_and_keeps_the_rest():
    attr = SensitiveAttribute.numeric(column=1, values=[10, 20, 30], encode=lambda v: v / 10 - 2)
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    out = attr.expand(x)
    assert out.shape == (2, 3, 4)
    assert torch.equal(out[:, :, 1], torch.tensor([[-1.0, 0.0, 1.0]] * 2))
    keep = [0, 2, 3]
    assert torch.equal(out[:, :, keep], x[:, None, keep].expand(2, 3, 3))
    assert torch.equal(x, torch.arange(8, dtype=torch.float32).reshape(2, 4))  # input untouched
    for k, v in enumerate(attr.values):
        assert torch.equal(attr.substitute(x, v), out[:, k])


def test_one_hot_expand_sets_exactly_one_column_of_the_group():
    attr = SensitiveAttribute.one_hot(columns=[3, 1, 4], values=["a", "b", "c"])
    x = torch.rand(5, 6)
    out = attr.expand(x)
    group = out[:, :, [3, 1, 4]]
    assert torch.equal(group, torch.eye(3).expand(5, 3, 3))
    assert torch.equal(out[:, :, [0, 2, 5]], x[:, None, [0, 2, 5]].expand(5, 3, 3))
    assert torch.equal(attr.substitute(x, "b"), out[:, 1])


def test_custom_attribute_on_dict_batches():
    def substitute(batch, value):
        return {"image": batch["image"].clone().fill_(value), "meta": batch["meta"]}

    attr = SensitiveAttribute.custom(substitute=substitute, values=[0.0, 0.5, 1.0], name="brightness")
    batch = {"image": torch.rand(2, 1, 3, 3), "meta": torch.tensor([7, 8])}
    out = attr.expand(batch)
    assert out["image"].shape == (2, 3, 1, 3, 3) and out["meta"].shape == (2, 3)
    assert torch.equal(out["image"][:, 2], torch.ones(2, 1, 3, 3))
    assert torch.equal(out["meta"], torch.tensor([[7] * 3, [8] * 3]))


def test_custom_substitute_that_changes_the_batch_form_is_rejected():
    attr = SensitiveAttribute.custom(substitute=lambda x, v: x[:, :1] * v, values=[1.0, 2.0])
    with pytest.raises(ValueError, match="same structure, shapes and dtypes"):
        attr.expand(torch.ones(2, 3))


def test_select_extremes_and_subsets():
    age = SensitiveAttribute.numeric(column=0, values=[40, 17, 90, 25])
    assert age.select("extremes").values == (17, 90)
    assert age.select([90, 40]).values == (90, 40)
    assert age.select("all") is age
    sex = SensitiveAttribute.one_hot(columns=[5, 6], values=["F", "M"])
    with pytest.raises(ValueError, match="ordered attribute"):
        sex.select("extremes")
    with pytest.raises(ValueError, match="candidate"):
        age.select([18])
    with pytest.raises(ValueError, match="'all', 'extremes'"):
        age.select("middle")


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: SensitiveAttribute.numeric(column=0, values=[1]), ValueError, "at least 2"),
        (lambda: SensitiveAttribute.numeric(column=0, values=[1, 1, 2]), ValueError, "distinct"),
        (lambda: SensitiveAttribute.numeric(column=0, values=[1, float("nan")]), ValueError, "finite"),
        (lambda: SensitiveAttribute.numeric(column=-1, values=[1, 2]), TypeError, "column"),
        (lambda: SensitiveAttribute.numeric(column=True, values=[1, 2]), TypeError, "column"),
        (lambda: SensitiveAttribute.numeric(column=0, values="ab"), TypeError, "values"),
        (
            lambda: SensitiveAttribute.numeric(column=0, values=[1, 2], encode=lambda v: float("inf")),
            ValueError,
            "encode",
        ),
        (lambda: SensitiveAttribute.one_hot(columns=[1, 2, 3], values=["a", "b"]), ValueError, "one value per column"),
        (lambda: SensitiveAttribute.one_hot(columns=[1, 1], values=["a", "b"]), ValueError, "distinct"),
        (lambda: SensitiveAttribute.custom(substitute=None, values=[1, 2]), TypeError, "substitute"),
        (lambda: SensitiveAttribute(kind="ordinal", values=[1, 2]), ValueError, "kind"),
    ],
)
def test_bad_specs_raise_clear_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_inputs_that_do_not_fit_the_attribute_raise():
    attr = SensitiveAttribute.numeric(column=5, values=[0, 1])
    with pytest.raises(ValueError, match="column 5.*only 3 columns"):
        attr.expand(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="floating-point tensor"):
        attr.expand(torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="candidates"):
        attr.substitute(torch.zeros(2, 8), 3)


def test_adult_age_round_trip(adult):
    age = adult.sensitive_attribute("age")
    assert age.values == tuple(range(17, 91)) and age.column == 0
    x, _ = adult.train_dataset.tensors
    raw = adult.train_table.numeric[:64, 0].astype(int)
    out = age.expand(x[:64])
    own = out[torch.arange(64), torch.as_tensor(raw - 17)]  # the substitution with the record's own age ...
    assert torch.allclose(own, x[:64], atol=1e-6)  # ... is the record itself
    decoded = adult.encoder.numeric_columns["age"].decode(out[0, :, 0].double().numpy())
    np.testing.assert_allclose(decoded, np.arange(17, 91), atol=1e-4)


def test_adult_one_hot_round_trip(adult):
    race = adult.sensitive_attribute("race")
    group = adult.encoder.one_hot_groups["race"]
    assert race.columns == group.columns and race.values == group.categories
    x, _ = adult.train_dataset.tensors
    own = x[:64][:, list(group.columns)].argmax(dim=1)
    assert torch.equal(race.expand(x[:64])[torch.arange(64), own], x[:64])
    assert adult.sensitive_attribute("sex", values=["Male", "Female"]).values == ("Male", "Female")
    with pytest.raises(ValueError, match="numeric column .* or a one-hot group"):
        adult.sensitive_attribute("height")


# ------------------------------------------------------------------------------ candidates vs data
def _batches(adult, size, count, seed=0):
    x, _ = adult.train_dataset.tensors
    g = torch.Generator().manual_seed(seed)
    return [x[torch.randint(0, len(x), (size,), generator=g)] for _ in range(count)]


@pytest.mark.parametrize("values", ["all", "extremes"])
def test_every_correctly_encoded_adult_attribute_fits_random_batches(adult, values):
    names = [*adult.encoder.numeric_columns, *adult.encoder.one_hot_groups]
    for batch in _batches(adult, CHECK_MIN_VALUES, 25):
        for name in names:
            attribute = adult.sensitive_attribute(name)
            attribute = attribute.select(values) if attribute.kind == "numeric" else attribute
            assert check_candidates(attribute, observed_values(attribute, batch)) is True, name


@pytest.mark.parametrize("name", ["age", "fnlwgt", "capital-gain", "capital-loss", "hours-per-week"])
def test_raw_values_into_adult_standardised_columns_are_far_outside(adult, name):
    encoded = adult.sensitive_attribute(name)
    raw = SensitiveAttribute.numeric(column=encoded.column, values=encoded.values, name=name)  # no `encode`
    for batch in _batches(adult, 256, 10):
        with pytest.raises(ValueError, match=rf"attribute '{name}' are far outside what input column"):
            check_candidates(raw, observed_values(raw, batch))


def test_the_numeric_rule_and_its_message():
    column = torch.linspace(-1.6, 3.9, 200, dtype=torch.float64)
    ages = SensitiveAttribute.numeric(column=0, values=range(17, 91), name="age")
    with pytest.raises(ValueError) as info:
        check_candidates(ages, column)
    message = str(info.value)
    assert "observed range is [-1.6, 3.9] (200 values)" in message and "written as given (no `encode`)" in message
    assert "range over [17, 90]" in message and "74 of the 74 lie more than 1 observed span" in message
    encoded = SensitiveAttribute.numeric(column=0, values=range(17, 91), encode=lambda a: (a - 38.4) / 13.1)
    assert check_candidates(encoded, column) is True
    # one candidate inside, but a span 10^5 times the column's: wrong unit
    with pytest.raises(ValueError, match=r"their span 1e\+05 is more than 100 times the column's span 5.5"):
        check_candidates(SensitiveAttribute.numeric(column=0, values=[0, 99999], name="income"), column)
    # exactly half of the candidates outside [lo - w, hi + w] still fits; more than half does not
    assert check_candidates(SensitiveAttribute.numeric(column=0, values=[0.0, 100.0]), column) is True
    with pytest.raises(ValueError, match="2 of the 3 lie"):
        check_candidates(SensitiveAttribute.numeric(column=0, values=[0.0, 100.0, 101.0]), column)


def test_too_few_or_too_uniform_values_tell_nothing():
    ages = SensitiveAttribute.numeric(column=0, values=range(17, 91))
    assert check_candidates(ages, torch.linspace(-1, 1, CHECK_MIN_VALUES - 1, dtype=torch.float64)) is None
    assert check_candidates(ages, torch.tensor([0.0, 1.0] * CHECK_MIN_VALUES, dtype=torch.float64)) is None
    nan_padded = torch.cat([torch.linspace(-1, 1, 10), torch.full((CHECK_MIN_VALUES,), float("nan"))])
    assert check_candidates(ages, nan_padded.double()) is None


def test_one_hot_groups_must_hold_zeros_and_ones_one_per_row():
    group = SensitiveAttribute.one_hot(columns=[1, 2], values=["F", "M"], name="sex")
    x = torch.tensor([[0.3, 1.0, 0.0], [-2.0, 0.0, 1.0], [5.0, 0.0, 0.0]])  # a row with neither is fine
    assert observed_values(group, x).shape == (3, 2) and check_candidates(group, observed_values(group, x)) is True
    with pytest.raises(ValueError, match=r"'sex' is a one-hot group over input columns \(1, 2\).*other than 0 and 1"):
        check_candidates(group, observed_values(group, x + 0.5))
    with pytest.raises(ValueError, match="1 of 3 rows of the batch hold a 1 in several"):
        check_candidates(group, observed_values(group, torch.cat([x[:2], torch.ones(1, 3)])))
    assert check_candidates(group, observed_values(group, x[:0])) is None


def test_custom_attributes_cannot_be_checked():
    custom = SensitiveAttribute.custom(substitute=lambda x, v: x * v, values=[1e6, 2e6])
    assert observed_values(custom, torch.ones(4, 2)) is None and check_candidates(custom, None) is None


def test_observed_values_of_higher_rank_inputs_and_bad_inputs():
    attr = SensitiveAttribute.numeric(column=1, values=[0, 1])
    x = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2)  # (batch, time, features)
    assert observed_values(attr, x).tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    with pytest.raises(ValueError, match="floating-point tensor"):
        observed_values(attr, torch.zeros(2, 3, dtype=torch.long))
