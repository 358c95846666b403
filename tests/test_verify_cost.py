"""bench profile --verify: a verify forward's parts timed alone, by rows and context, against their floors."""

import pytest

from playground.evaluation import verify_cost
from playground.model import kernels

pytestmark = pytest.mark.skipif(not kernels.status().loaded, reason=kernels.status().note)


@pytest.fixture(scope="module")
def breakdown(target):
    return verify_cost.measure(target, rows=(1, 3), contexts=(32, 96), repeats=3)


def test_every_part_is_timed_for_every_rows_and_context(breakdown):
    assert [(c.rows, c.context) for c in breakdown.cells] == [(1, 32), (3, 32), (1, 96), (3, 96)]
    for cell in breakdown.cells:
        assert cell.stack_ms > 0 and cell.projections_ms > 0 and cell.head_ms > 0
        assert cell.verify_ms == pytest.approx(cell.stack_ms + cell.head_ms)
        assert cell.rest_ms == pytest.approx(cell.stack_ms - cell.projections_ms - cell.attention_ms)


def test_the_floors_are_the_bytes_or_the_arithmetic_whichever_takes_longer(breakdown, target):
    b = breakdown
    assert b.projection_bytes == sum(x.nbytes for layer in target.layers for x in (layer.qkv, layer.o, layer.gate_up,
                                                                                   layer.down))
    one, six = b.floor_ms(b.projection_bytes, b.projection_macs), b.floor_ms(b.projection_bytes, 6 * b.projection_macs)
    assert one == pytest.approx(max(b.projection_bytes / b.bandwidth_gb_s, 2 * b.projection_macs / b.matmul_gflop_s) / 1e6)
    assert six >= one and six == pytest.approx(max(one, 12 * b.projection_macs / b.matmul_gflop_s / 1e6))
    # a cached position is its keys and values in every layer
    assert b.cache_bytes_per_token == 2 * target.num_layers * target.num_kv_heads * target.head_dim * 4


def test_the_report_has_a_table_per_context_with_each_rows_ratio_to_one(breakdown):
    text = verify_cost.markdown(breakdown)
    assert text.count("| rows | verify ms (x 1 row) |") == 2
    assert "After 32 tokens of context" in text and "After 96 tokens of context" in text
    row_of_three = next(line for line in text.splitlines() if line.startswith("| 3 |"))
    assert f"({breakdown.cell(3, 32).stack_ms / breakdown.cell(1, 32).stack_ms:.2f}x)" in row_of_three
