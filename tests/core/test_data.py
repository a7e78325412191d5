"""maps_core.data: the CSV reader shared by load_csv, the CLI and the demo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maps_core import SchemaError, load_csv, read_table


def write(tmp_path: Path, text: str, encoding: str = "utf-8") -> Path:
    p = tmp_path / "data.csv"
    p.write_text(text, encoding=encoding)
    return p


def test_two_row_header_with_bom_and_blank_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "\ufeffage,smoker,colour,Class\nd,B,E,T\n\n30,1,red,0\n41,0,blue,1\n,,,\n",
              encoding="utf-8")
    names, codes, rows = read_table(p)
    assert names == ["age", "smoker", "colour", "Class"]
    assert codes == ["D", "B", "E", "T"]  # codes are case-insensitive
    assert rows == [["30", "1", "red", "0"], ["41", "0", "blue", "1"]]
    ds = load_csv(p)
    assert ds.target == "Class" and ds.y.tolist() == [0, 1]
    assert ds.schema.names == ["age", "smoker", "colour=blue", "colour=red"]
    assert np.array_equal(ds.X, [[30, 1, 0, 1], [41, 0, 1, 0]])
    assert [f.type for f in ds.schema] == ["integer", "binary", "categorical", "categorical"]


def test_plain_header_infers_types(tmp_path: Path) -> None:
    p = write(tmp_path, "a,b,Class\n0.5,1,0\n1.5,0,1\n")
    names, codes, _ = read_table(p)
    assert codes is None
    ds = load_csv(p)
    assert [f.type for f in ds.schema] == ["continuous", "binary"]
    assert (ds.schema.features[0].lower, ds.schema.features[0].upper) == (0.5, 1.5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,Class\n1,2\n", "line 2: 2 fields, the header has 3"),
        ("a,b,Class\nF,F,T\n1,2,0\n3,4\n", "line 4: 2 fields, the header has 3"),
        ("a,b,Class\n", "expected a header row and at least one data row"),
        ("a,b,Class\nF,F,T\n", "no data rows"),
        # read by name, the first 'Class' stood for the label: the F column's values
        ("a,Class,Class\nF,F,T\n1,7.5,0\n2,8.5,1\n", "names 'Class' more than once"),
        ("h,h,Class\nF,E,T\n1,x,0\n2,y,1\n", "names 'h' more than once"),
        ("a,,Class\n1,2,0\n", "column 2 has no name"),
    ],
)
def test_malformed_tables_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        read_table(write(tmp_path, text))


def test_missing_file_and_missing_label(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="data file not found"):
        load_csv(tmp_path / "nope.csv")
    with pytest.raises(SchemaError, match="no label column 'Class'"):
        load_csv(write(tmp_path, "a,b\n1,2\n"))


def test_each_type_code_has_one_meaning(tmp_path: Path) -> None:
    p = write(tmp_path, "f,d,b,e,g,Class\nF,D,B,E,E,T\n1,2,0,x,u,0\n3,5,1,y,u,1\n2,?,1,,u,1\n")
    ds = load_csv(p)
    assert ds.schema.names == ["f", "d", "b", "e=x", "e=y", "g=u"]
    assert [f.type for f in ds.schema] == ["continuous", "integer", "binary", "categorical",
                                           "categorical", "binary"]
    f, d, b, ex, _, gu = ds.schema.features
    assert (f.lower, f.upper) == (1.0, 3.0)  # F stays continuous although whole
    assert (d.lower, d.upper) == (2.0, 5.0)  # bounds over the values present
    assert (b.lower, b.upper) == (0.0, 1.0)
    assert ex.group == "e"
    # a single-category E column is a constant, not a one-column group
    assert gu.group is None and gu.domain() == (1.0, 1.0)
    # a missing value is NaN: in its cell, or across its one-hot group
    assert np.isnan(ds.X[2, 1]) and np.isnan(ds.X[2, 3]) and np.isnan(ds.X[2, 4])
    assert np.array_equal(ds.X[:2, 3:], [[1, 0, 1], [0, 1, 1]])
    whole = load_csv(p, whole_floats_as_integers=True)
    assert whole.schema.features[0].type == "integer"
    # E columns kept as codes: strings by their sorted position, as pandas numbers them
    coded = load_csv(p, categories="codes")
    assert coded.schema.names == ["f", "d", "b", "e", "g"]
    e, g = coded.schema.features[3:]
    assert (e.type, e.lower, e.upper) == ("nominal", 0.0, 1.0)
    assert (g.type, g.lower, g.upper) == ("nominal", 0.0, 0.0)
    assert np.array_equal(coded.X[:2, 3:], [[0, 0], [1, 0]]) and np.isnan(coded.X[2, 3])
    with pytest.raises(ValueError, match="categories"):
        load_csv(p, categories="ordinal")


def test_integer_categories_are_their_own_codes(tmp_path: Path) -> None:
    """Codes written as numbers stay themselves (not their positions), 10 above 9."""
    p = write(tmp_path, "c,Class\nE,T\n10,0\n9,1\n3,0\n")
    ds = load_csv(p, categories="codes")
    assert ds.X[:, 0].tolist() == [10.0, 9.0, 3.0]
    assert ds.schema.features[0].domain() == (3.0, 10.0)
    # a negative or fractional one is not a code: positions instead
    ds = load_csv(write(tmp_path, "c,Class\nE,T\n-1,0\n2.5,1\n"), categories="codes")
    assert ds.X[:, 0].tolist() == [0.0, 1.0]
    # numbers in numeric order, as pandas sorts numeric categories (not "-1" < "10" < "2")
    ds = load_csv(write(tmp_path, "c,Class\nE,T\n10,0\n-1,1\n2,0\n"), categories="codes")
    assert ds.X[:, 0].tolist() == [2.0, 0.0, 1.0]
    # an infinite category is no number to sort: the column's strings are sorted instead
    ds = load_csv(write(tmp_path, "c,Class\nE,T\n1,0\ninf,1\n2,0\n"), categories="codes")
    assert ds.X[:, 0].tolist() == [0.0, 2.0, 1.0]


def test_spellings_of_one_number_are_one_category_in_both_encodings(tmp_path: Path) -> None:
    """A column of numbers written 1 and 1.0 (a spreadsheet's export of a merged file) was
    two categories one-hot (columns c=1 and c=1.0) and one code: the encodings disagreed
    on the number of categories, so a model trained on one could not be explained on the
    other's terms."""
    p = write(tmp_path, "c,Class\nE,T\n1,0\n1.0,1\n2,0\n2.00,1\n10,0\n")
    hot = load_csv(p)
    assert hot.schema.names == ["c=1", "c=10", "c=2"]  # string order, first spellings
    assert np.array_equal(hot.X, [[1, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 1], [0, 1, 0]])
    codes = load_csv(p, categories="codes")
    assert codes.X[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 10.0]
    # both encodings group the rows alike
    assert len({tuple(r) for r in hot.X}) == len(set(codes.X[:, 0])) == 3
    # strings stay strings: "1" and "1.0" among words are two categories, in both
    p = write(tmp_path, "c,Class\nE,T\n1,0\n1.0,1\nred,0\n")
    assert load_csv(p).schema.names == ["c=1", "c=1.0", "c=red"]
    assert load_csv(p, categories="codes").X[:, 0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,Class\nB,T\n2,0\n", "coded B .binary. but holds 2"),
        ("a,Class\nD,T\n1.5,0\n", "coded D .discrete. but holds 1.5"),
        ("a,Class\nF,T\nabc,0\n", "line 3: column 'a' has the non-numeric value 'abc'"),
        ("a,Class\n1,0\ninf,1\n", "line 3: column 'a' has an infinite value"),
        ("a,Class\nF,T\n1,\n", "line 3: the label 'Class' is missing"),
        # Python's float() reads these; a CSV file means no number by them
        ("a,Class\nF,T\n1,0\n2,-nan\n", "line 4: the label 'Class' is missing"),
        ("a,Class\nF,T\n1,+NaN\n2,1\n", "line 3: the label 'Class' is missing"),
        ("a,Class\nF,T\n1_000,0\n", "line 3: column 'a' has the non-numeric value '1_000'"),
        ("a,b,c\nT,F,T\n1,2,0\n", "more than one column is coded T"),
    ],
)
def test_values_a_code_forbids_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        load_csv(write(tmp_path, text))


def test_no_label_column_when_not_required(tmp_path: Path) -> None:
    ds = load_csv(write(tmp_path, "a,b\n1,2\n3,4\n"), require_target=False)
    assert ds.y is None and ds.target is None and ds.X.shape == (2, 2)


def test_credit_loads_as_shipped(shared_dir: Path) -> None:
    """Credit.csv's SEX column holds one category: it loads as a constant column."""
    ds = load_csv(shared_dir / "datasets" / "Credit.csv")
    assert ds.target == "DEFAULT_PAYEMENT" and ds.X.shape[0] == len(ds.y)
    groups = ds.schema.groups()
    assert sorted(groups) == ["EDUCATION", "MARRIAGE"]
    assert [len(v) for v in (groups["EDUCATION"], groups["MARRIAGE"])] == [4, 3]
    sex = ds.schema.index("SEX=Male")
    assert ds.schema.features[sex].domain() == (1.0, 1.0) and np.all(ds.X[:, sex] == 1)
    assert not np.isnan(ds.X).any()
    # every row of a one-hot group holds exactly one category
    for cols in groups.values():
        assert np.all(ds.X[:, cols].sum(axis=1) == 1)


def test_a_trailing_comma_on_every_line_is_no_column(tmp_path: Path) -> None:
    """A spreadsheet's export: the empty last field hid the type row, and the error blamed
    the data ("column 'a' has the non-numeric value 'F'")."""
    ds = load_csv(write(tmp_path, "a,b,Class,\nF,D,T,\n1.5,2,0,\n3,4,1,\n"))
    assert ds.schema.names == ["a", "b"] and ds.y.tolist() == [0, 1]
    assert [f.type for f in ds.schema] == ["continuous", "integer"]


def test_labels_and_options_load_csv_refuses(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="line 3: the label 'Class' is infinite"):
        load_csv(write(tmp_path, "a,Class\nF,T\n1,inf\n2,1\n"))
    # the file's own label would have become a feature
    with pytest.raises(SchemaError, match="codes 'label' T"):
        load_csv(write(tmp_path, "a,b,label\nF,F,T\n1,0,yes\n2,1,no\n"), target="b")
    with pytest.raises(SchemaError, match="categories must be"):
        load_csv(write(tmp_path, "a,Class\nF,T\n1,0\n"), categories="onehot")
