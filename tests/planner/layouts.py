"""Every pipelined strategy the search's layouts offer, AllReduce in every stage."""

from __future__ import annotations

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.pipeline_stages import device_speed, pipeline_layouts
from tagplan.planner.strategy import Strategy
from tagplan.planner.topology import Cluster


def layout_strategies(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> list[Strategy]:
    """One strategy per layout and micro-batch count, in layout order."""
    speed = device_speed(ir, cluster, costs)
    return [
        layout.strategy(ir, cluster, speed, micro_batches)
        for layout in pipeline_layouts(ir, cluster, costs)
        for micro_batches in layout.micro_batches
    ]
