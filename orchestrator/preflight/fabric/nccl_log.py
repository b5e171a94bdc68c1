"""Parse ``NCCL_DEBUG=INFO`` output: NCCL version, network per host, HCAs, and the transport of
every channel connection; then answer "which inter-node connections went over sockets?".

Pure and stdlib-only, so the controller can run it over the logs it collected from every node.
It reads what NCCL 2.3 to 2.2x print, with whatever a launcher put in front of each line:

    host:pid:tid [cudaDev] NCCL INFO <message>                      (NCCL's own prefix)
    [1,0]<stdout>:host:pid:tid [0] NCCL INFO ...                    (mpirun --tag-output)
    Wed Sep  6 17:26:52 2023[1,5]<stdout>:host:pid:tid [5] ...      (mpirun --timestamp-output)
    [155] host:pid:tid [3] NCCL INFO ...                            (rank tags)
    host: host:pid:tid [4] NCCL INFO ...                            (pdsh / clush)
    [default0]:host:pid:tid [0] NCCL INFO ...                       (torchrun --tee)
    (RayWorkerWrapper pid=660) host:pid:tid [6] NCCL INFO ...       (Ray)
     [0] NCCL INFO ...   and   NCCL version 2.4.7+cuda10.0           (no host: the caller's `host`)

Lines from many ranks may be interleaved in any order; lines that are not NCCL's are ignored.

Connection lines changed wording over the versions; all of these are read:

    Ring 00 : 6 -> 2 [receive] via NET/IB/0                          (2.4)
    Ring 00 : 155[3d000] -> 157[b2000] via P2P/IPC                   (2.5, 2.6: [busId])
    Channel 03 : 7[b2000] -> 14[b1000] [send] via NET/IB/0/GDRDMA    (2.7, 2.8)
    Channel 00/0 : 9[1] -> 0[0] [send] via NET/IB/0(8)/GDRDMA        (2.9+: [cudaDev], PXN proxy)
    Channel 09 : 6[6] -> 7[7] via SHM/direct/direct                  (p2p channels)
    Channel 04/0 : 12[4] -> 4[4] [receive] via NET/NCCL RDMA Plugin v8/4/GDRDMA

Pitfall the parser avoids: NCCL <= 2.5 prints ``NET/Socket : Using [0]ib0:...`` on every rank even
when it then uses InfiniBand (the socket transport is always initialised). That line alone is
therefore no evidence of a socket fallback; only ``Using network Socket``, ``NET/IB : No device
found`` and connections ``via NET/Socket`` are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Network plugins that move data over TCP (no RDMA): NCCL's own socket transport and Google's
# FastSocket plugin. Everything else that NCCL calls a NET (IB, IBext*, OFI/Libfabric, vendor
# RDMA plugins) is treated as the RDMA path.
SOCKET_NETS = frozenset({"Socket", "FastSocket"})

_PREFIX_RE = re.compile(
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<where>\S+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_HOSTLESS_RE = re.compile(
    r"(?:^|\s)\[(?P<dev>\d+)\] (?:(?P<where>\S+:\d+) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_BARE_RE = re.compile(r"(?:^|[\s:>)\]])NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$")
_VERSION_RE = re.compile(r"\bNCCL version (?P<full>(?P<num>\d+\.\d+\.\d+)[^\s]*)")

_CONN_RE = re.compile(
    r"\b(?P<kind>Ring|Channel) (?P<ch>\d+)(?:/(?P<sub>\d+))? : +"
    r"(?P<src>\d+)(?:\[(?P<srcdev>[0-9a-fA-F]+)\])? -> (?P<dst>\d+)(?:\[(?P<dstdev>[0-9a-fA-F]+)\])?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
_VIA_TAIL_RE = re.compile(r"\s+comm 0x[0-9a-fA-F]+.*$")
_NET_VIA_RE = re.compile(r"^NET/(?P<net>.+?)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<rest>/.*)?$")

_IB_USING_RE = re.compile(r"^NET/IB ?: Using (?P<devs>.*?)(?:\s*;\s*OOB (?P<oob>\S+))?\s*$")
_IB_GROUP_RE = re.compile(r"\[(?P<vdev>\d+)\]=\{(?P<inner>[^}]*)\}")
_IB_DEV_RE = re.compile(
    r"\[(?P<idx>\d+)\] ?(?P<name>[^\s:\[\]{},=]+)(?::uverbs\d+)?:(?P<port>\d+)"
    r"/(?P<ll>IB|RoCE)(?P<flags>(?:/[A-Za-z]+)*)"
)
_IB_DEVLINE_RE = re.compile(r"^NET/IB ?: (?=\[\d+\] )(?P<rest>.*)$")
_SOCKET_USING_RE = re.compile(r"^NET/Socket ?: Using (?P<ifs>.*)$")
_IFACE_RE = re.compile(r"(?:\[\d+\])?(?P<name>[^\s:<\[\]]+):(?P<addr>[^<\s]+)<\d+>")
_BOOTSTRAP_RE = re.compile(r"^Bootstrap ?: Using (?P<ifs>.*)$")
_NETWORK_RE = re.compile(
    r"^(?:Using network|Using internal Network|Initialized NET plugin|Assigned NET plugin) "
    r"(?P<net>.+?)(?: to comm)?\s*$"
)
_PLUGIN_RES = (
    re.compile(r"^P2P plugin (?P<name>\S+)"),
    re.compile(r"^NET/Plugin ?: Loaded net plugin (?P<name>\S+)"),
    re.compile(r"^Plugin Path : (?P<name>\S+)"),
)
_COMM_RE = re.compile(
    r"\bcomm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)"
    r"(?: nNodes (?P<nnodes>\d+))?(?:.*?- Init (?P<state>START|COMPLETE))?"
)
_OLD_COMM_RE = re.compile(r"^rank (?P<rank>\d+) nranks (?P<nranks>\d+)\s*$")
_NCCLTESTS_RANK_RE = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+device\s+\d+"
)


@dataclass(frozen=True)
class Source:
    """Where a parsed fact came from: the process that logged it and the raw line (the evidence)."""

    host: str | None
    pid: int | None
    dev: int | None  # the [N] in NCCL's prefix: the CUDA device of the logging thread
    lineno: int  # 1-based, in the text given to `parse`
    line: str


@dataclass(frozen=True)
class IbDevice:
    """One HCA port from ``NET/IB : Using [i]name:port/IB|RoCE``."""

    index: int  # NCCL's net device index, as in ``via NET/IB/<index>`` (the virtual one if merged)
    name: str  # mlx5_0, mlx5_bond_0, ...
    port: int
    link_layer: str  # "IB" or "RoCE"
    flags: tuple[str, ...] = ()  # e.g. ("SHARP",)
    member: int | None = None  # index inside a merged (NIC fusion) device ``[0]={[0] mlx5_2:1/RoCE, ...}``


@dataclass(frozen=True)
class Interface:
    """A TCP/IP interface NCCL named: ``eth0:10.0.0.1``."""

    name: str
    addr: str


@dataclass(frozen=True)
class Connection:
    """One ``Ring``/``Channel`` line: a peer connection set up on one channel."""

    channel: int
    src: int  # global rank (in the communicator that logged it)
    dst: int
    direction: str | None  # "send" / "receive" for NET connections; None for P2P and SHM
    transport: str  # "NET", "P2P", "SHM" (or the first word NCCL printed, e.g. "CollNet")
    net: str | None  # for NET: "IB", "Socket", "IBext_v8", "NCCL RDMA Plugin v8", ...
    net_dev: int | None  # for NET: the device index (see IbDevice.index)
    proxy_rank: int | None  # PXN: the rank whose NIC carries the data, ``NET/IB/0(8)``
    detail: str  # what follows: "GDRDMA", "IPC/read", "direct pointer", "CUMEM", "direct/direct"
    via: str  # the text after "via", as printed
    source: Source

    @property
    def local_rank(self) -> int:
        """The rank of the process that logged the line (the receiver for ``[receive]``)."""
        return self.dst if self.direction == "receive" else self.src

    @property
    def peer_rank(self) -> int:
        """The rank on the other end."""
        return self.src if self.direction == "receive" else self.dst

    @property
    def inter_node(self) -> bool:
        """NCCL routes through a NET transport only between ranks it did not place on one host
        (or when P2P and SHM are disabled); P2P and SHM never leave the host."""
        return self.transport == "NET"

    @property
    def uses_socket(self) -> bool:
        """Whether the data goes over TCP sockets (NET/Socket, NET/FastSocket)."""
        return self.transport == "NET" and self.net in SOCKET_NETS


@dataclass(frozen=True)
class CommRank:
    """``comm 0x... rank R nranks N ... - Init START|COMPLETE`` (or 2.3's ``rank R nranks N``)."""

    comm: str | None
    rank: int
    nranks: int
    nnodes: int | None
    state: str | None  # "START", "COMPLETE" or None
    source: Source


@dataclass
class Process:
    """Everything one process (host, pid) logged about its network setup."""

    host: str | None
    pid: int | None
    ib_devices: list[IbDevice] = field(default_factory=list)
    oob: Interface | None = None
    socket_ifaces: list[Interface] = field(default_factory=list)
    bootstrap: Interface | None = None
    networks: list[str] = field(default_factory=list)  # "Using network X", in order, no repeats
    no_ib_device: bool = False
    plugins: list[str] = field(default_factory=list)
    evidence: list[Source] = field(default_factory=list)  # the lines behind the fields above

    def ib_device(self, index: int) -> IbDevice | None:
        """The HCA behind ``NET/IB/<index>`` (the first member for a merged device)."""
        for dev in self.ib_devices:
            if dev.index == index:
                return dev
        return None


@dataclass
class NcclLog:
    """The result of `parse`."""

    versions: list[tuple[str, Source]] = field(default_factory=list)  # ("2.18.3+cuda12.2", line)
    processes: dict[tuple[str | None, int | None], Process] = field(default_factory=dict)
    connections: list[Connection] = field(default_factory=list)
    comm_ranks: list[CommRank] = field(default_factory=list)
    warnings: list[Source] = field(default_factory=list)  # NCCL WARN lines
    rank_hosts: dict[int, set[str]] = field(default_factory=dict)  # rank -> hosts seen for it
    nccl_lines: int = 0

    @property
    def version(self) -> str | None:
        """The NCCL version (``2.18.3``) when every versioned line agrees, else None."""
        numbers = {v.split("+")[0].split("-")[0] for v, _ in self.versions}
        return numbers.pop() if len(numbers) == 1 else None

    @property
    def version_numbers(self) -> set[str]:
        """Every distinct NCCL version printed (more than one: nodes run different NCCLs)."""
        return {v.split("+")[0].split("-")[0] for v, _ in self.versions}

    @property
    def hosts(self) -> list[str]:
        """Hosts that logged NCCL lines, sorted."""
        return sorted({h for h, _ in self.processes if h is not None})

    def host_processes(self, host: str | None) -> list[Process]:
        """The processes seen on one host."""
        return [p for (h, _), p in self.processes.items() if h == host]

    def networks(self, host: str | None) -> list[str]:
        """The network(s) NCCL selected on a host: "IB", "Socket", a plugin name ("IBext_v8"), ...

        Explicit ``Using network X`` lines win. Older NCCLs do not print one: then ``NET/IB : Using``
        means IB and ``NET/IB : No device found`` means Socket. Empty when the log does not say.
        """
        procs = self.host_processes(host)
        explicit: list[str] = []
        for proc in procs:
            for net in proc.networks:
                if net not in explicit:
                    explicit.append(net)
        if explicit:
            return explicit
        if any(p.ib_devices for p in procs):
            return ["IB"]
        if any(p.no_ib_device for p in procs):
            return ["Socket"]
        return []

    def ib_devices(self, host: str | None) -> list[IbDevice]:
        """The HCAs NCCL listed on a host (first listing per process, merged across processes)."""
        seen: dict[tuple[int, str, int | None], IbDevice] = {}
        for proc in self.host_processes(host):
            for dev in proc.ib_devices:
                seen.setdefault((dev.index, dev.name, dev.member), dev)
        return sorted(seen.values(), key=lambda d: (d.index, d.member or 0))

    def oob(self, host: str | None) -> Interface | None:
        """The out-of-band (bootstrap) interface NCCL's IB transport uses on a host."""
        for proc in self.host_processes(host):
            if proc.oob is not None:
                return proc.oob
        return None

    def host_of_rank(self, rank: int) -> str | None:
        """The host a rank ran on, when the log names exactly one (ranks of different communicators
        can share numbers; then it is ambiguous and None)."""
        hosts = self.rank_hosts.get(rank, set())
        return next(iter(hosts)) if len(hosts) == 1 else None

    def transports(self, host: str | None = None) -> dict[str, int]:
        """Connection counts by transport label ("NET/IB", "NET/Socket", "P2P/IPC", "SHM", ...)."""
        counts: dict[str, int] = {}
        for conn in self.connections:
            if host is not None and conn.source.host != host:
                continue
            label = transport_label(conn)
            counts[label] = counts.get(label, 0) + 1
        return counts


def transport_label(conn: Connection) -> str:
    """A short label: ``NET/<net>`` for network transports, ``P2P/<mechanism>``, ``SHM``."""
    if conn.transport == "NET":
        return f"NET/{conn.net}"
    if conn.transport == "P2P":
        mech = conn.detail.split("/")[0]
        return f"P2P/{mech}" if mech else "P2P"
    return conn.transport


# ----------------------------------------------------------------------------- parsing


def parse(text: str | Iterable[str], host: str | None = None) -> NcclLog:
    """Parse NCCL_DEBUG=INFO output (a string or an iterable of lines).

    ``host`` names the node for lines that carry no ``host:pid:tid`` prefix (NCCL's bare
    ``NCCL version`` line, or logs whose prefix was stripped); lines with a prefix keep their own.
    """
    lines = text.splitlines() if isinstance(text, str) else [line.rstrip("\n") for line in text]
    log = NcclLog()
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        _parse_line(log, line, lineno, host)
    return log


def _parse_line(log: NcclLog, line: str, lineno: int, default_host: str | None) -> None:
    m = _NCCLTESTS_RANK_RE.match(line)
    if m:  # nccl-tests' "#  Rank  1 Pid 2152176 on dgxh100-3 device 0 ..." header
        log.rank_hosts.setdefault(int(m["rank"]), set()).add(m["host"])
        return
    host, pid, dev, level, msg = _split_prefix(line, default_host)
    if level is not None:
        log.nccl_lines += 1
    version = _VERSION_RE.search(line)
    if version and (level is None or msg.startswith("NCCL version")):
        log.versions.append((version["full"], Source(host, pid, dev, lineno, line)))
        return
    if level is None:
        return
    src = Source(host, pid, dev, lineno, line)
    if level == "WARN":
        log.warnings.append(src)
        return
    proc = log.processes.get((host, pid))
    if proc is None:
        proc = log.processes[(host, pid)] = Process(host, pid)
    _parse_message(log, proc, msg, src)


def _split_prefix(line: str, default_host: str | None) -> tuple[str | None, int | None, int | None, str | None, str]:
    m = _PREFIX_RE.search(line)
    if m:
        return m["host"], int(m["pid"]), int(m["dev"]), m["level"], m["msg"]
    m = _HOSTLESS_RE.search(line)
    if m:
        return default_host, None, int(m["dev"]), m["level"], m["msg"]
    m = _BARE_RE.search(line)
    if m:
        return default_host, None, None, m["level"], m["msg"]
    return default_host, None, None, None, line


def _parse_message(log: NcclLog, proc: Process, msg: str, src: Source) -> None:
    m = _CONN_RE.search(msg)
    if m:
        conn = _connection(m, src)
        log.connections.append(conn)
        if src.host is not None:
            log.rank_hosts.setdefault(conn.local_rank, set()).add(src.host)
        return
    m = _IB_USING_RE.match(msg)
    if m:
        if not proc.ib_devices:
            proc.ib_devices = _ib_devices(m["devs"])
        if m["oob"]:
            proc.oob = _iface(m["oob"])
        proc.evidence.append(src)
        return
    m = _IB_DEVLINE_RE.match(msg)
    if m:  # one device per line: 2.3 "NET/IB: [0] mlx5_1:1/IB", 2.2x "NET/IB: [2] mlx5_2:uverbs2:1/RoCE ..."
        for dev in _ib_devices(m["rest"]):
            if proc.ib_device(dev.index) is None:
                proc.ib_devices.append(dev)
        return
    if msg.startswith(("NET/IB : No device found", "NET/IB: No device found")):
        proc.no_ib_device = True
        proc.evidence.append(src)
        return
    m = _SOCKET_USING_RE.match(msg)
    if m:
        proc.socket_ifaces = [Interface(i["name"], i["addr"]) for i in _IFACE_RE.finditer(m["ifs"])]
        return
    m = _BOOTSTRAP_RE.match(msg)
    if m:
        found = _IFACE_RE.search(m["ifs"])
        if found:
            proc.bootstrap = Interface(found["name"], found["addr"])
        return
    m = _NETWORK_RE.match(msg)
    if m:
        if m["net"] not in proc.networks:
            proc.networks.append(m["net"])
        proc.evidence.append(src)
        return
    for regex in _PLUGIN_RES:
        m = regex.match(msg)
        if m:
            if m["name"] not in proc.plugins:
                proc.plugins.append(m["name"])
            return
    m = _COMM_RE.search(msg) or _OLD_COMM_RE.match(msg)
    if m:
        groups = m.groupdict()
        cr = CommRank(
            groups.get("comm"),
            int(m["rank"]),
            int(m["nranks"]),
            int(groups["nnodes"]) if groups.get("nnodes") else None,
            groups.get("state"),
            src,
        )
        log.comm_ranks.append(cr)
        if src.host is not None:
            log.rank_hosts.setdefault(cr.rank, set()).add(src.host)


def _connection(m: re.Match[str], src: Source) -> Connection:
    via = _VIA_TAIL_RE.sub("", m["via"])
    transport, net, net_dev, proxy, detail = "", None, None, None, ""
    nm = _NET_VIA_RE.match(via)
    if nm:
        transport, net, net_dev = "NET", nm["net"], int(nm["dev"])
        proxy = int(nm["proxy"]) if nm["proxy"] else None
        detail = (nm["rest"] or "").lstrip("/")
    elif via.startswith("P2P/"):
        transport, detail = "P2P", via[len("P2P/") :]
    elif via.startswith("SHM") or via == "direct shared memory":
        transport, detail = "SHM", via.removeprefix("SHM/")
    else:
        transport, _, detail = via.partition("/")
    return Connection(
        channel=int(m["ch"]),
        src=int(m["src"]),
        dst=int(m["dst"]),
        direction=m["dir"],
        transport=transport,
        net=net,
        net_dev=net_dev,
        proxy_rank=proxy,
        detail=detail,
        via=via,
        source=src,
    )


def _ib_devices(text: str) -> list[IbDevice]:
    devices: list[IbDevice] = []
    groups = list(_IB_GROUP_RE.finditer(text))
    if groups:  # NIC fusion: "[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]={...}"
        for g in groups:
            for d in _IB_DEV_RE.finditer(g["inner"]):
                devices.append(_ib_device(d, index=int(g["vdev"]), member=int(d["idx"])))
        return devices
    return [_ib_device(d, index=int(d["idx"]), member=None) for d in _IB_DEV_RE.finditer(text)]


def _ib_device(d: re.Match[str], index: int, member: int | None) -> IbDevice:
    flags = tuple(f for f in d["flags"].split("/") if f)
    return IbDevice(index=index, name=d["name"], port=int(d["port"]), link_layer=d["ll"], flags=flags, member=member)


def _iface(text: str) -> Interface:
    name, _, rest = text.partition(":")
    return Interface(name, rest.split("<")[0])


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class SocketFinding:
    """A host where NCCL moved (or would move) inter-node data over TCP sockets."""

    host: str  # "?" when the lines carry no host and none was given to `parse`
    reason: str
    peers: tuple[str, ...]  # "rank 6 on node-b" / "rank 6" for the socket connections
    evidence: tuple[str, ...]  # the NCCL lines, verbatim (at most `max_evidence`)
    connections: int  # how many socket connections the log shows for this host

    def message(self) -> str:
        """One line for a check result: the host, the reason and the first NCCL line."""
        first = f": {self.evidence[0].strip()!r}" if self.evidence else ""
        return f"{self.host}: {self.reason}{first}"


def inter_node_socket_connections(log: NcclLog) -> list[Connection]:
    """Every connection NCCL set up between nodes over TCP sockets (NET/Socket, NET/FastSocket)."""
    return [c for c in log.connections if c.inter_node and c.uses_socket]


def socket_findings(log: NcclLog, max_evidence: int = 3) -> list[SocketFinding]:
    """Which hosts used sockets between nodes, with the NCCL lines that show it.

    A host is named when (1) it logged connections via NET/Socket (or FastSocket), or (2) NCCL on
    it said ``Using network Socket`` or ``NET/IB : No device found`` (it has nothing else to use
    between nodes, even if the log holds no connection lines). The result is sorted by host.
    """
    by_host: dict[str, list[Connection]] = {}
    for conn in inter_node_socket_connections(log):
        by_host.setdefault(conn.source.host or "?", []).append(conn)
    findings: dict[str, SocketFinding] = {}
    for name, conns in by_host.items():
        peers = []
        for conn in conns:
            peer_host = log.host_of_rank(conn.peer_rank)
            peer = f"rank {conn.peer_rank}" + (f" on {peer_host}" if peer_host else "")
            if peer not in peers:
                peers.append(peer)
        nets = sorted({c.net or "" for c in conns})
        findings[name] = SocketFinding(
            host=name,
            reason=f"{len(conns)} inter-node connection(s) via NET/{'/'.join(nets)}",
            peers=tuple(peers),
            evidence=tuple(c.source.line for c in conns[:max_evidence]),
            connections=len(conns),
        )
    selection: dict[str, list[Source]] = {}
    for (host, _), proc in log.processes.items():
        selection.setdefault(host or "?", []).extend(s for s in proc.evidence if _says_socket(s.line))
    for key, socket_lines in selection.items():
        if key in findings or not socket_lines:
            continue
        socket_lines.sort(key=lambda s: s.lineno)
        reason = (
            "NCCL selected network Socket"
            if any("Using network" in s.line for s in socket_lines)
            else "NCCL found no InfiniBand/RoCE device (NET/IB : No device found)"
        )
        findings[key] = SocketFinding(
            host=key,
            reason=reason,
            peers=(),
            evidence=tuple(s.line for s in socket_lines[:max_evidence]),
            connections=0,
        )
    return [findings[h] for h in sorted(findings)]


def _says_socket(line: str) -> bool:
    if "No device found" in line:
        return True
    m = re.search(r"Using network (\S+)", line)
    return bool(m and m.group(1) in SOCKET_NETS)


def summary(log: NcclLog) -> dict[str, Any]:
    """A JSON-ready digest for a check result: version(s), per host network/HCAs/OOB/transport
    counts, and the socket findings."""
    hosts: dict[str, Any] = {}
    for host in log.hosts:
        oob = log.oob(host)
        hosts[host] = {
            "networks": log.networks(host),
            "ib_devices": [f"{d.name}:{d.port}/{d.link_layer}" for d in log.ib_devices(host)],
            "oob": f"{oob.name}:{oob.addr}" if oob else None,
            "transports": log.transports(host),
        }
    return {
        "nccl_version": log.version,
        "nccl_versions": sorted(log.version_numbers),
        "hosts": hosts,
        "socket_findings": [
            {"host": f.host, "reason": f.reason, "peers": list(f.peers), "evidence": list(f.evidence)}
            for f in socket_findings(log)
        ],
        "warnings": [w.line for w in log.warnings],
    }
