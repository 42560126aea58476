"""The baselines as their systems configure them: where ``dp-ps`` puts its shards."""

from __future__ import annotations

import numpy as np

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.search.baselines import dp_ps
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster
from tests.planner.compile.test_graphdef import committed


def test_dp_ps_spreads_parameter_bytes_over_machines_then_gpus() -> None:
    """Each machine's network link carries the traffic of the shards it holds, so the
    greedy placement balances bytes per machine first. Balancing GPUs alone put the
    largest parameters on the first machine's GPUs (its bytes 2.1x the machines' mean
    here, 3.0x with 8 GPUs per machine) and made its link the bottleneck of every step."""
    machines = [
        {"name": f"m{i}", "gpus": {"type": "P100", "count": 4}, "intra_bandwidth_gbps": 80}
        for i in range(8)
    ]
    cluster = load_cluster({"machines": machines, "network": {"bandwidth_gbps": 10}})
    _, ir = committed("inception_v3")
    costs = OpCostModel(ir, cluster)
    resolved = resolve(dp_ps(ir, cluster, costs), ir, cluster)
    shard = resolved.group_ps_device[resolved.op_group[ir.parameters.variable_op]]
    assert (shard >= 0).all()
    per_device = np.bincount(shard, weights=ir.parameters.bytes, minlength=cluster.num_devices)
    per_machine = np.bincount(cluster.device_machine, weights=per_device)
    assert per_machine.max() <= 1.02 * per_machine.mean()
    for machine in range(cluster.num_machines):  # and the GPUs of a machine share its bytes
        members = per_device[cluster.machine_devices(machine)]
        largest_there = ir.parameters.bytes[np.isin(shard, cluster.machine_devices(machine))].max()
        assert members.max() - members.min() <= largest_there
