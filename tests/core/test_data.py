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
