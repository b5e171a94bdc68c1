"""The NCCL log parser against real NCCL_DEBUG=INFO output (tests/fixtures/nccl; sources in
tests/fixtures/README.md)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.preflight.fabric import nccl_log
from orchestrator.preflight.fabric.nccl_log import IbDevice, Interface

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def load(name: str, host: str | None = None) -> nccl_log.NcclLog:
    return nccl_log.parse((FIXTURES / name).read_text(), host=host)


def lines_of(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


# Every fixture file must be covered by a test below (a new file without expectations fails).
COVERED = {
    "ib_nccl2.4.7_2node_init_nv_peer_memory-56.txt",
    "ib_nccl2.4.7_2node_rings_nv_peer_memory-56.txt",
    "socket_nccl2.4-format_aws_init_nccl-226.txt",
    "socket_nccl2.4-format_aws_rings_nccl-226.txt",
    "socket_lo_nccl2.5.6_mpirun-tag-output_nccl-300.txt",
    "ib-roce-mixed_nccl2.6.2_rank-tagged_nccl-302.txt",
    "roce_nccl2.5.7_no-host-prefix_shm_nccl-392.txt",
    "roce-bond_nccl2.8.3_2node_init_tf-interleaved_nccl-429.txt",
    "roce-bond_nccl2.8.3_2node_channels_nccl-429.txt",
    "roce_nccl2.19.3_2node_dgxh100_nccl-tests-185.txt",
    "socket-fallback_ibext-no-device_channels_nccl-952.txt",
    "ibext-v8-plugin_p2p-cumem_nccl-1814.txt",
    "ibext-v8_init-complete_64rank_nccl-1814.txt",
    "shm_h800_1node_nccl-1609.txt",
    "socket+shm_2node-same-hostname_nccl-tests-166.txt",
    "net-plugin-name-with-spaces_2node_nccl-tests-319.txt",
    "roce-merged-devices_ibext-v8_ib-disable-ignored_nccl-tests-373.txt",
    "socket_lo_ib-disabled_topology_nccl-1053.txt",
    "ib_multinode_p2p-direct-pointer_nccl-1412.txt",
    "ib_nccl2.18.3_timestamp-and-tag-prefix_nccl-957.txt",
    "ib-sharp_ibext_pdsh-host-prefix_nccl-1029.txt",
}


def test_every_fixture_is_covered_and_read() -> None:
    files = {p.name for p in FIXTURES.glob("*.txt")}
    assert files == COVERED
    for name in sorted(files):
        log = load(name)
        # every non-empty line is either an NCCL line, a version line, or not NCCL's at all
        nccl = [line for line in lines_of(name) if "NCCL INFO" in line or "NCCL WARN" in line]
        assert log.nccl_lines == len(nccl), name


# ----------------------------------------------------------------------------- InfiniBand


def test_ib_2_4_7_init_devices_version_and_the_socket_line_pitfall() -> None:
    log = load("ib_nccl2.4.7_2node_init_nv_peer_memory-56.txt")
    assert log.version == "2.4.7"
    assert [v for v, _ in log.versions] == ["2.4.7+cuda10.0"]
    assert log.hosts == ["master_node", "secondary_node"]
    assert log.networks("master_node") == ["IB"]
    assert log.ib_devices("master_node") == [IbDevice(0, "mlx5_0", 1, "IB")]
    assert log.oob("master_node") == Interface("ib0", "192.168.11.1")
    assert len(log.host_processes("master_node")) == 4  # pids 20..23, one per GPU
    assert log.processes[("master_node", 20)].socket_ifaces == [Interface("ib0", "192.168.11.1")]
    # NCCL 2.4 prints "NET/Socket : Using" on every rank even when it uses IB: secondary_node's
    # NET/IB lines are not in the excerpt, so its network is unknown, and it is NOT a socket finding.
    assert log.networks("secondary_node") == []
    assert nccl_log.socket_findings(log) == []


def test_ib_2_4_7_rings_all_inter_node_connections_via_net_ib() -> None:
    log = load("ib_nccl2.4.7_2node_rings_nv_peer_memory-56.txt")
    assert len(log.connections) == 10
    net = [c for c in log.connections if c.inter_node]
    assert [(c.src, c.dst, c.direction, c.via) for c in net] == [
        (6, 2, "receive", "NET/IB/0"),
        (6, 2, "send", "NET/IB/0"),
        (2, 6, "receive", "NET/IB/0"),
        (3, 6, "send", "NET/IB/0"),
    ]
    assert all(c.net == "IB" and c.net_dev == 0 and not c.uses_socket for c in net)
    assert log.transports() == {"P2P/IPC": 6, "NET/IB": 4}
    # ranks 0-3 on master_node, 4-7 on secondary_node, learnt from who logged which end
    assert {r: log.host_of_rank(r) for r in range(8)} == {
        0: "master_node",
        1: "master_node",
        2: "master_node",
        3: "master_node",
        4: "secondary_node",
        5: "secondary_node",
        6: "secondary_node",
        7: "secondary_node",
    }
    recv = net[0]
    assert (recv.local_rank, recv.peer_rank, recv.source.host) == (2, 6, "master_node")
    assert nccl_log.inter_node_socket_connections(log) == []
    assert nccl_log.socket_findings(log) == []


def test_ib_roce_mixed_2_6_2_rank_tag_prefix_resolves_net_device_to_the_roce_port() -> None:
    log = load("ib-roce-mixed_nccl2.6.2_rank-tagged_nccl-302.txt")
    host = "crow-ib-new-nccl-262-b-7"
    assert log.hosts == [host]  # the "[56] " mpirun tag is not part of the host
    assert log.networks(host) == ["IB"]
    assert [(d.index, d.name, d.link_layer) for d in log.ib_devices(host)] == [
        (0, "mlx5_3", "IB"),
        (1, "mlx5_0", "IB"),
        (2, "mlx5_2", "RoCE"),
        (3, "mlx5_4", "IB"),
    ]
    assert log.oob(host) == Interface("eth0", "10.100.72.18")
    (net,) = [c for c in log.connections if c.inter_node]
    assert (net.src, net.dst, net.direction, net.net, net.net_dev) == (51, 56, "receive", "IB", 2)
    # the inter-node ring of this IB job runs on the one RoCE port: the bug the issue is about
    proc = log.processes[(host, 7240)]
    assert proc.ib_device(2) == IbDevice(2, "mlx5_2", 1, "RoCE")
    assert len(log.warnings) == 1 and "ibv_modify_qp failed" in log.warnings[0].line
    assert nccl_log.socket_findings(log) == []


def test_ib_2_8_3_roce_bond_init_between_tensorflow_lines() -> None:
    log = load("roce-bond_nccl2.8.3_2node_init_tf-interleaved_nccl-429.txt")
    assert log.version == "2.8.3"
    assert log.nccl_lines == 12  # 16 lines: 3 TensorFlow lines and the bare version line are not INFO
    for host, addr in (("machine-1", "10.11.170.43"), ("machine-2", "10.11.170.41")):
        assert log.networks(host) == ["IB"]
        assert log.ib_devices(host) == [IbDevice(0, "mlx5_bond_0", 1, "RoCE")]
        assert log.oob(host) == Interface("eth0", addr)
    assert log.processes[("machine-1", 16194)].bootstrap == Interface("eth0", "10.11.170.43")


def test_ib_2_8_3_channels_busid_format_gdrdma_and_rank_hosts() -> None:
    log = load("roce-bond_nccl2.8.3_2node_channels_nccl-429.txt")
    assert log.transports() == {"P2P/direct pointer": 11, "NET/IB": 3}
    net = [c for c in log.connections if c.inter_node]
    assert [(c.channel, c.src, c.dst, c.direction, c.detail) for c in net] == [
        (3, 7, 14, "receive", "GDRDMA"),
        (3, 7, 14, "send", "GDRDMA"),
        (1, 15, 6, "send", "GDRDMA"),
    ]
    assert log.host_of_rank(7) == "machine-2" and log.host_of_rank(14) == "machine-1"
    assert log.host_of_rank(15) == "machine-1"
    assert nccl_log.socket_findings(log) == []


def test_ib_multinode_2_1x_format_net_ib_3_and_p2p_direct_pointer_read() -> None:
    log = load("ib_multinode_p2p-direct-pointer_nccl-1412.txt")
    assert log.transports() == {"P2P/direct pointer": 10, "NET/IB": 4}
    net = [c for c in log.connections if c.inter_node]
    assert {(c.src, c.dst, c.direction, c.net_dev) for c in net} == {(5, 12, "send", 3), (13, 4, "receive", 3)}
    p2p = [c for c in log.connections if c.transport == "P2P"]
    assert {c.detail for c in p2p} == {"direct pointer/read"}
    assert {c.channel for c in net} == {3, 7}
    assert nccl_log.socket_findings(log) == []


def test_ib_2_18_3_timestamp_and_tag_prefix() -> None:
    log = load("ib_nccl2.18.3_timestamp-and-tag-prefix_nccl-957.txt")
    assert log.hosts == ["tomte249"]  # not "2023[1,5]<stdout>"
    assert log.networks("tomte249") == ["IB"]
    (cr,) = log.comm_ranks
    assert (cr.comm, cr.rank, cr.nranks, cr.state) == ("0xdf895650", 0, 2, "START")
    assert log.connections == []  # "+ NET[12.5] - NET/0" topology lines are not connections


def test_ib_sharp_ibext_plugin_behind_a_pdsh_host_prefix() -> None:
    log = load("ib-sharp_ibext_pdsh-host-prefix_nccl-1029.txt")
    host = "rdma-gpu-train-worker-0"
    assert log.hosts == [host]
    assert log.networks(host) == ["IBext"]
    assert log.ib_devices(host) == [IbDevice(0, "mlx5_9", 1, "IB", ("SHARP",))]
    assert log.oob(host) == Interface("eth0", "10.224.3.48")
    assert log.processes[(host, 19488)].plugins == ["/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so", "IBext"]
    assert sorted((c.rank, c.nranks, c.state) for c in log.comm_ranks) == [
        (0, 16, "START"),
        (1, 16, "START"),
        (4, 16, "START"),
        (7, 16, "START"),
    ]
    assert nccl_log.socket_findings(log) == []


# ----------------------------------------------------------------------------- RoCE


def test_roce_2_19_3_two_dgx_h100() -> None:
    log = load("roce_nccl2.19.3_2node_dgxh100_nccl-tests-185.txt")
    assert log.version == "2.19.3"
    for host, addr in (("dgxh100-3", "11.1.128.128"), ("dgxh100-4", "11.1.128.136")):
        assert log.networks(host) == ["IB"]
        assert log.ib_devices(host) == [IbDevice(0, "mlx5_10", 1, "RoCE"), IbDevice(1, "mlx5_11", 1, "RoCE")]
        assert log.oob(host) == Interface("enp220s0np0", addr)
    assert log.host_of_rank(1) == "dgxh100-3"  # from nccl-tests' "#   Rank  1 Pid ... on dgxh100-3"
    assert nccl_log.socket_findings(log) == []


def test_roce_2_5_7_lines_without_host_take_the_given_host() -> None:
    name = "roce_nccl2.5.7_no-host-prefix_shm_nccl-392.txt"
    log = load(name, host="node-a")
    assert log.hosts == ["node-a"]
    assert log.version == "2.5.7"  # from "NCCL INFO NCCL version 2.5.7+cuda10.0"
    assert log.networks("node-a") == ["IB"]
    assert log.ib_devices("node-a") == [IbDevice(0, "mlx5_0", 1, "RoCE")]
    assert log.oob("node-a") == Interface("br0", "10.137.141.16")
    # "Channel 00/02 :    0   1   2 ..." is the ring order, not a connection
    assert log.transports("node-a") == {"NET/IB": 2, "P2P/IPC": 2, "SHM": 1}
    shm = next(c for c in log.connections if c.transport == "SHM")
    assert (shm.src, shm.dst, shm.detail) == (0, 7, "direct shared memory")
    assert load(name).hosts == []  # without a host the lines belong to no named host


def test_roce_merged_nic_fusion_devices_and_ibext_v8() -> None:
    log = load("roce-merged-devices_ibext-v8_ib-disable-ignored_nccl-tests-373.txt")
    assert log.networks("bigo") == ["IBext_v8"]
    assert log.ib_devices("bigo") == [
        IbDevice(0, "mlx5_2", 1, "RoCE", member=0),
        IbDevice(0, "mlx5_3", 1, "RoCE", member=1),
        IbDevice(1, "mlx5_0", 1, "RoCE", member=2),
        IbDevice(1, "mlx5_1", 1, "RoCE", member=3),
    ]
    assert log.oob("bigo") == Interface("bond0.526", "169.136.106.9")
    assert [(c.rank, c.nranks, c.nnodes) for c in log.comm_ranks] == [(2, 3, None), (2, 3, 3)]
    assert log.transports("bigo") == {"NET/IBext_v8": 3}
    assert {c.net_dev for c in log.connections} == {1}
    # the issue: NCCL_IB_DISABLE=1 was set, yet the IBext plugin carried the traffic, not sockets
    assert nccl_log.socket_findings(log) == []


# ----------------------------------------------------------------------------- plugins, P2P, SHM


def test_ibext_v8_plugin_and_p2p_cumem() -> None:
    log = load("ibext-v8-plugin_p2p-cumem_nccl-1814.txt")
    assert log.transports() == {"P2P/CUMEM": 12, "NET/IBext_v8": 1}
    (net,) = [c for c in log.connections if c.inter_node]
    assert (net.channel, net.src, net.dst, net.direction, net.net, net.net_dev) == (9, 33, 41, "send", "IBext_v8", 4)
    assert nccl_log.socket_findings(log) == []


def test_init_complete_lines_map_ranks_to_hosts() -> None:
    log = load("ibext-v8_init-complete_64rank_nccl-1814.txt")
    assert sorted((c.rank, c.nranks, c.state) for c in log.comm_ranks) == [
        (32, 64, "COMPLETE"),
        (34, 64, "COMPLETE"),
        (35, 64, "COMPLETE"),
        (36, 64, "COMPLETE"),
    ]
    assert {r: log.host_of_rank(r) for r in (32, 34, 35, 36)} == dict.fromkeys((32, 34, 35, 36), "hostname-test")
    assert log.connections == []


def test_net_plugin_name_with_spaces() -> None:
    log = load("net-plugin-name-with-spaces_2node_nccl-tests-319.txt")
    net = [c for c in log.connections if c.inter_node]
    assert len(net) == 8
    assert {c.net for c in net} == {"NCCL RDMA Plugin v8"}
    assert {(c.net_dev, c.detail) for c in net} == {(4, "GDRDMA"), (2, "GDRDMA")}
    assert log.transports("lccn09") == {"NET/NCCL RDMA Plugin v8": 8, "P2P/CUMEM": 1}
    assert log.transports("lccn19") == {"P2P/CUMEM": 2}
    assert nccl_log.socket_findings(log) == []  # an RDMA plugin, not sockets


def test_shm_only_single_node() -> None:
    log = load("shm_h800_1node_nccl-1609.txt")
    assert log.transports() == {"SHM": 12}
    assert {c.detail for c in log.connections} == {"direct/direct"}
    assert sorted({c.channel for c in log.connections}) == list(range(3)) + list(range(7, 16))
    assert not any(c.inter_node for c in log.connections)
    assert nccl_log.socket_findings(log) == []


# ----------------------------------------------------------------------------- socket fallback


def test_socket_fallback_aws_init_names_exactly_the_hosts_without_ib() -> None:
    log = load("socket_nccl2.4-format_aws_init_nccl-226.txt")
    no_ib = [
        "ip-172-31-1-23",
        "ip-172-31-1-46",
        "ip-172-31-1-93",
        "ip-172-31-11-39",
        "ip-172-31-12-21",
        "ip-172-31-5-233",
        "ip-172-31-7-53",
        "ip-172-31-8-135",
    ]
    findings = nccl_log.socket_findings(log)
    assert [f.host for f in findings] == no_ib
    assert all(log.networks(h) == ["Socket"] for h in no_ib)
    first = findings[0]
    assert first.evidence == ("ip-172-31-1-23:45357:45357 [0] NCCL INFO NET/IB : No device found.",)
    assert "no InfiniBand" in first.reason
    # hosts that only printed "NET/Socket : Using" or the plugin line are not judged
    assert log.networks("ip-172-31-12-210") == []
    assert log.processes[("ip-172-31-12-210", 45305)].socket_ifaces == [Interface("ens3", "172.31.12.210")]


def test_socket_fallback_aws_rings_fail_naming_host_and_peer() -> None:
    log = load("socket_nccl2.4-format_aws_rings_nccl-226.txt")
    socket_conns = nccl_log.inter_node_socket_connections(log)
    assert len(socket_conns) == 15 == len(log.connections)
    findings = {f.host: f for f in nccl_log.socket_findings(log)}
    assert len(findings) == 15
    f = findings["ip-172-31-12-210"]
    assert f.peers == ("rank 46 on ip-172-31-0-110",)
    assert f.evidence == ("ip-172-31-12-210:45305:45310 [0] NCCL INFO Ring 00 : 46 -> 44 [receive] via NET/Socket/0",)
    assert f.message() == (
        "ip-172-31-12-210: 1 inter-node connection(s) via NET/Socket: "
        "'ip-172-31-12-210:45305:45310 [0] NCCL INFO Ring 00 : 46 -> 44 [receive] via NET/Socket/0'"
    )
    assert findings["ip-172-31-0-8"].peers == ("rank 62",)  # rank 62's host is not in the excerpt


def test_socket_fallback_despite_ibext_plugin_names_the_host() -> None:
    log = load("socket-fallback_ibext-no-device_channels_nccl-952.txt")
    (finding,) = nccl_log.socket_findings(log)
    assert finding.host == "<cluster_name>"  # anonymised by the poster, kept as the host
    assert finding.connections == 2
    assert finding.peers == ("rank 6",)
    assert finding.evidence == (
        "<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
        "<cluster_name>:926:1151 [7] NCCL INFO Channel 07/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
    )
    assert log.transports() == {"P2P/IPC": 14, "NET/Socket": 2}
    assert {c.detail for c in log.connections if c.transport == "P2P"} == {"IPC/read"}


def test_socket_and_shm_two_nodes_with_the_same_hostname() -> None:
    log = load("socket+shm_2node-same-hostname_nccl-tests-166.txt")
    assert log.transports() == {"NET/Socket": 8, "SHM": 7}
    (finding,) = nccl_log.socket_findings(log)
    assert (finding.host, finding.connections, finding.peers) == ("ubuntu", 8, ("rank 0",))
    assert sorted(c.channel for c in nccl_log.inter_node_socket_connections(log)) == list(range(14, 22))
    # both nodes are called "ubuntu": processes stay apart by pid
    assert sorted(pid or 0 for host, pid in log.processes if host == "ubuntu") == [9621, 39964]


def test_socket_selected_on_lo_with_ib_disabled() -> None:
    log = load("socket_lo_ib-disabled_topology_nccl-1053.txt")
    assert log.networks("axa") == ["Socket"]
    (finding,) = nccl_log.socket_findings(log)
    assert finding.host == "axa" and finding.reason == "NCCL selected network Socket"
    assert finding.evidence == ("axa:3048391:3048566 [0] NCCL INFO Using network Socket",)
    assert log.processes[("axa", 3048391)].socket_ifaces == [Interface("lo", "127.0.0.1")]
    assert log.connections == []


def test_socket_no_ib_device_behind_mpirun_tag_output() -> None:
    log = load("socket_lo_nccl2.5.6_mpirun-tag-output_nccl-300.txt")
    assert log.version == "2.5.6"  # "[1,0]<stdout>:NCCL version 2.5.6+cuda10.2"
    assert log.hosts == ["5873af64cf59"]
    assert sorted(pid or 0 for _, pid in log.processes) == [10158, 10159, 10160, 10161]
    assert log.networks("5873af64cf59") == ["Socket"]
    assert log.processes[("5873af64cf59", 10158)].bootstrap == Interface("lo", "127.0.0.1")
    (finding,) = nccl_log.socket_findings(log)
    assert finding.host == "5873af64cf59" and finding.connections == 0
    assert len(finding.evidence) == 3  # capped at max_evidence (3 ranks said "No device found")


# ----------------------------------------------------------------------------- robustness


def test_interleaved_logs_of_two_runs_give_the_same_answers() -> None:
    """Merge the IB init and ring logs line by line in random order: same facts as each alone."""
    a, b = (
        lines_of("ib_nccl2.4.7_2node_init_nv_peer_memory-56.txt"),
        lines_of("ib_nccl2.4.7_2node_rings_nv_peer_memory-56.txt"),
    )
    merged = a + b
    random.Random(7).shuffle(merged)
    log = nccl_log.parse(merged)
    assert log.version == "2.4.7"
    assert log.networks("master_node") == ["IB"]
    assert log.transports() == {"P2P/IPC": 6, "NET/IB": 4}
    assert log.host_of_rank(6) == "secondary_node"
    assert nccl_log.socket_findings(log) == []


def test_torchrun_tee_prefix_and_crlf() -> None:
    """torchrun --tee puts "[default<local_rank>]:" before each worker line (tests/fixtures/README)."""
    line = lines_of("socket-fallback_ibext-no-device_channels_nccl-952.txt")[7]
    log = nccl_log.parse(f"[default7]:{line}\r\n")
    (conn,) = log.connections
    assert conn.source.host == "<cluster_name>" and conn.uses_socket and conn.net_dev == 3


def test_summary_is_json_ready_and_names_socket_hosts() -> None:
    import json

    log = load("socket_nccl2.4-format_aws_rings_nccl-226.txt")
    digest = json.loads(json.dumps(nccl_log.summary(log)))
    assert digest["nccl_version"] is None
    assert digest["hosts"]["ip-172-31-12-210"]["transports"] == {"NET/Socket": 1}
    assert len(digest["socket_findings"]) == 15
    ib = nccl_log.summary(load("roce_nccl2.19.3_2node_dgxh100_nccl-tests-185.txt"))
    assert ib["nccl_versions"] == ["2.19.3"] and ib["socket_findings"] == []
    assert ib["hosts"]["dgxh100-4"] == {
        "networks": ["IB"],
        "ib_devices": ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"],
        "oob": "enp220s0np0:11.1.128.136",
        "transports": {},
    }


def test_two_versions_are_reported_not_merged() -> None:
    text = (FIXTURES / "ib_nccl2.4.7_2node_init_nv_peer_memory-56.txt").read_text() + (
        FIXTURES / "roce_nccl2.19.3_2node_dgxh100_nccl-tests-185.txt"
    ).read_text()
    log = nccl_log.parse(text)
    assert log.version is None
    assert log.version_numbers == {"2.4.7", "2.19.3"}


@pytest.mark.parametrize(
    "line",
    [
        "2020-12-04 00:05:40.139653: I tensorflow/core/nccl/nccl_manager.cc:286] 0 $$$$$$$$$$$$$$1",
        "#   Rank  1 Pid 2152176 on  dgxh100-3 device  0 [0xd1] NVIDIA H100 80GB HBM3",
        "[56]",
        "",
    ],
)
def test_lines_that_are_not_nccl_info_are_ignored(line: str) -> None:
    log = nccl_log.parse(line)
    assert log.nccl_lines == 0 and log.connections == [] and log.processes == {}
