"""The one markdown table writer every report uses."""

from playground.evaluation.tables import markdown_table, write_results


def test_columns_of_numbers_align_right_and_cells_keep_their_pipes_escaped():
    table = markdown_table(["drafter", "tau", "vs k=5 (95% CI)", "note"],
                           [["EAGLE 3", "1.81", "1.41x (1.35-1.47)", "a | b"], ["EAGLE 3.1", "2.05", "–", "k=1"]])
    head, rule, *rows = table.split("\n")
    assert head == "| drafter | tau | vs k=5 (95% CI) | note |"
    assert rule == "|---|---:|---:|---|"
    assert rows == ["| EAGLE 3 | 1.81 | 1.41x (1.35-1.47) | a \\| b |", "| EAGLE 3.1 | 2.05 | – | k=1 |"]
    assert markdown_table(["a", "b"], []) == "| a | b |\n|---|---|"
    no_values = markdown_table(["ratio", "none yet"], [["-", "–"], ["1.20x", ""]]).split("\n")[1]
    assert no_values == "|---:|---|", "a cell with no value leaves its column's alignment to the others"


def test_results_are_written_as_markdown_beside_json(tmp_path):
    md, js = write_results(tmp_path / "new", {"rows": [1]}, "# report\n")
    assert md.read_text() == "# report\n" and js.read_text() == '{\n "rows": [\n  1\n ]\n}'
