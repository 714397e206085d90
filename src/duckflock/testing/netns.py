"""Several "hosts" on one Linux machine: network namespaces joined by veth pairs to a bridge.

    root namespace (this process, the caller)           host i = namespace ``duckflock-<tag>-<i>``
    bridge dfb<tag>  10.250.X.254/24  ──veth──  eth0  10.250.X.<i+1>/24   (plus its own loopback)

Each host has its own loopback and one address in a private /24 under 10.250.0.0/16 that no other
run on this machine uses. The namespaces get no default route and the root namespace does not forward
(we never enable it), so traffic from a host can only reach the other hosts and the bridge address.

Slow links: ``rate`` and ``delay`` shape both directions of every host's link, on both ends of its
veth (the host end shapes what it sends, the bridge end what it receives). ``delay`` is the one-way
latency between two hosts, so each of the two veth ends on a host-to-host path adds half of it.
``sch_netem`` does both; kernels built without it (e.g. some micro-VMs) still get ``rate`` through
``tbf``, and ``delay`` then raises ``ShapingUnavailable`` unless ``strict_delay=False`` (which
records in ``shaping`` that no delay was modelled).

Everything is torn down on exit, on failure half-way through building, and at interpreter exit.
Names carry this process's pid, so parallel runs never clash and leftovers of dead runs can be
recognized (``remove_stale``).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from duckflock.processes import pid_alive

PREFIX = "duckflock"  # namespaces: duckflock-<tag>-<i>, tag = <pid hex>x<sequence number hex>
BRIDGE_PREFIX = "dfb"  # bridge: dfb<tag>; root ends of the veths: dfv<tag>.<i hex>
VETH_PREFIX = "dfv"
MAX_HOSTS = 16  # interface names have at most 15 characters: dfv + 6 + x + 3 + . + 1
SUBNETS = ipaddress.IPv4Network("10.250.0.0/16")
_seq = itertools.count()


class NamespacesUnavailable(RuntimeError):
    """This machine or user cannot build network namespaces (not root, no ``ip``, EPERM, ...)."""


class ShapingUnavailable(NamespacesUnavailable):
    """The requested link shaping needs a queueing discipline this kernel lacks."""


def ip_binary() -> str | None:
    """``ip`` from PATH or the sbin directories (often missing from a non-root PATH)."""
    return shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/local/sbin")


def tc_binary() -> str | None:
    return shutil.which("tc") or shutil.which("tc", path="/usr/sbin:/sbin:/usr/local/sbin")


def unavailable() -> str | None:
    """Why namespaces cannot be built here, or None when they (probably) can."""
    if not Path("/proc/self/ns/net").exists():
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root or in a privileged container)"
    if ip_binary() is None:
        return "the `ip` command (iproute2) is not installed"
    return None


def parse_rate(text: str) -> float:
    """A tc rate ("100mbit", "10gbit", "5mbps", "800kbit") in bits per second."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a rate: {text!r} (use e.g. 100mbit, 1gbit, 10gbit)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    unit = 8 if m.group(3) == "bps" else 1  # tc: "bps" means bytes per second
    return float(m.group(1)) * scale * unit


def parse_delay(text: str) -> float:
    """A tc time ("0.2ms", "5ms", "100us", "1s") in seconds."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(s|ms|us|usec|msec|sec)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a delay: {text!r} (use e.g. 0.2ms, 5ms, 100us)")
    scale = {None: 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
    return float(m.group(1)) * scale[m.group(2)]


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done


def _denied(e: subprocess.CalledProcessError) -> bool:
    text = (e.stderr or "").lower()
    return any(s in text for s in ("operation not permitted", "permission denied", "eperm"))

    return True


def _used_subnets() -> set[ipaddress.IPv4Network]:
    """/24s under 10.250.0.0/16 already routed in the root namespace (other runs, or real networks)."""
    ip = ip_binary()
    out = _run(ip, "-4", "route", "show", check=False).stdout if ip else ""
    used = set()
    for word in re.findall(r"\b10\.250\.\d+\.\d+(?:/\d+)?", out):
        used.add(ipaddress.IPv4Network(word, strict=False).supernet(new_prefix=24))
    return used


class Hosts:
    """``n`` hosts as network namespaces on one bridge; a context manager.

    ``prefix(i)`` runs a command on host ``i`` (``[ip, "netns", "exec", name]``); ``address(i)`` is
    its IPv4 address, reachable from this process (the bridge has ``bridge_address``).
    """

    def __init__(
        self,
        n: int,
        rate: str | None = None,
        delay: str | None = None,
        strict_delay: bool = True,
    ):
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"Hosts builds 1 to {MAX_HOSTS} hosts, not {n}")
        self.n = n
        self.rate = rate
        self.delay = delay
        self.strict_delay = strict_delay
        self.seq = next(_seq) % 0x1000
        self.tag = f"{os.getpid():x}x{self.seq:x}"
        self.names = [f"{PREFIX}-{self.tag}-{i}" for i in range(n)]
        self.bridge = f"{BRIDGE_PREFIX}{self.tag}"
        self.veths = [f"{VETH_PREFIX}{self.tag}.{i:x}" for i in range(n)]
        self.subnet: ipaddress.IPv4Network | None = None
        self.shaping = "none"  # what was really applied, for reports
        self._ip = ip_binary() or "ip"
        self._made_ns: list[str] = []
        self._made_bridge = False
        self._made_veths: list[str] = []

    # ---- public --------------------------------------------------------------------------------
    def prefix(self, i: int) -> list[str]:
        return [self._ip, "netns", "exec", self.names[i]]

    def address(self, i: int) -> str:
        assert self.subnet is not None, "Hosts is not built (use it as a context manager)"
        return str(self.subnet.network_address + i + 1)

    @property
    def bridge_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 254)

    def link_tx_bytes(self) -> list[int]:
        """Bytes each host has sent on its link so far (counted at the bridge end of its veth,
        so TCP/IP and gRPC framing are included: what really crossed the "wire")."""
        out = []
        for v in self.veths:
            path = Path(f"/sys/class/net/{v}/statistics/rx_bytes")
            out.append(int(path.read_text()) if path.exists() else 0)
        return out

    def cut(self, i: int) -> None:
        """Take host i's link down: its packets are dropped, no reset tells its peers."""
        _run(self._ip, "link", "set", self.veths[i], "down")

    def set_link(self, rate: str | None, delay: str | None) -> str:
        """(Re)shape every host's link; ``None, None`` removes shaping. Returns the description also
        kept in ``shaping``."""
        self.rate, self.delay = rate, delay
        if rate is None and delay is None:
            for i in range(self.n):
                for dev, ns in self._ends(i):
                    self._tc(ns, "qdisc", "del", "dev", dev, "root", check=False)
            self.shaping = "none"
            return self.shaping
        if netem_available():
            args = ["netem", "limit", "100000"]
            if rate:
                args += ["rate", rate]
            if delay:
                args += ["delay", f"{parse_delay(delay) / 2 * 1e6:.1f}us"]
            self.shaping = f"netem rate {rate or 'unlimited'} one-way delay {delay or '0'} between hosts"
        else:
            if delay and self.strict_delay:
                raise ShapingUnavailable(
                    f"delay {delay} needs sch_netem, which this kernel lacks (CONFIG_NET_SCH_NETEM)"
                )
            if rate is None:
                raise ShapingUnavailable("this kernel lacks sch_netem, and no rate was asked for")
            args = _tbf_args(rate)
            self.shaping = f"tbf rate {rate}" + (
                f" (delay {delay} NOT modelled: kernel without sch_netem)" if delay else ""
            )
        for i in range(self.n):
            for dev, ns in self._ends(i):
                self._tc(ns, "qdisc", "replace", "dev", dev, "root", *args)
        return self.shaping

    # ---- building and tearing down ---------------------------------------------------------------
    def __enter__(self) -> Hosts:
        reason = unavailable()
        if reason:
            raise NamespacesUnavailable(reason)
        remove_stale()  # leftovers of runs that were killed before they could clean up
        atexit.register(self.close)
        try:
            self._build()
            if self.rate or self.delay:
                self.set_link(self.rate, self.delay)
        except subprocess.CalledProcessError as e:
            self.close()
            cmd = " ".join(e.cmd)
            if _denied(e):
                raise NamespacesUnavailable(f"`{cmd}` was refused: {e.stderr.strip()}") from None
            raise RuntimeError(f"`{cmd}` failed: {(e.stderr or '').strip()}") from None
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        ip = self._ip
        self.subnet = self._pick_subnet()
        plen = self.subnet.prefixlen
        _run(ip, "link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _run(ip, "addr", "add", f"{self.bridge_address}/{plen}", "dev", self.bridge)
        _run(ip, "link", "set", self.bridge, "up")
        for i, (ns, veth) in enumerate(zip(self.names, self.veths, strict=True)):
            _run(ip, "netns", "add", ns)
            self._made_ns.append(ns)
            _run(ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made_veths.append(veth)
            _run(ip, "link", "set", veth, "master", self.bridge)
            _run(ip, "link", "set", veth, "up")
            _run(ip, "-n", ns, "link", "set", "lo", "up")
            _run(ip, "-n", ns, "addr", "add", f"{self.address(i)}/{plen}", "dev", "eth0")
            _run(ip, "-n", ns, "link", "set", "eth0", "up")
        self._wait_reachable()

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        used = _used_subnets()
        # Start at a pid-dependent /24 so concurrent runs rarely even race for the same one.
        subnets = list(SUBNETS.subnets(new_prefix=24))[1:255]
        start = (os.getpid() * 7 + self.seq) % len(subnets)
        for k in range(len(subnets)):
            candidate = subnets[(start + k) % len(subnets)]
            if candidate not in used:
                return candidate
        raise NamespacesUnavailable("every test subnet under 10.250.0.0/16 is in use")

    def _wait_reachable(self, timeout: float = 10.0) -> None:
        """Until every host's address answers a TCP connect (refused counts) from this namespace:
        the bridge ports take a moment to forward after coming up."""
        import socket

        deadline = time.monotonic() + timeout
        for i in range(self.n):
            while True:
                try:
                    with socket.create_connection((self.address(i), 9), timeout=0.5):
                        break
                except ConnectionRefusedError:
                    break  # the host answered (with a reset): its link works
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"host {i} at {self.address(i)} is not reachable") from None
                    time.sleep(0.05)

    def _ends(self, i: int) -> list[tuple[str, str | None]]:
        """(device, namespace) of both ends of host i's veth: egress of each end is one direction."""
        return [("eth0", self.names[i]), (self.veths[i], None)]

    def _tc(self, ns: str | None, *args: str, check: bool = True) -> None:
        tc = tc_binary()
        if tc is None:
            raise ShapingUnavailable("link shaping needs the `tc` command (iproute2)")
        _run(tc, *(["-n", ns] if ns else []), *args, check=check)

    def close(self) -> None:
        """Remove everything this object built (idempotent; errors are ignored on the way)."""
        atexit.unregister(self.close)
        for ns in self._made_ns:
            _end_processes_in(self._ip, ns)
            _run(self._ip, "netns", "del", ns, check=False)  # takes the veth pair with it
        for veth in self._made_veths:
            if Path(f"/sys/class/net/{veth}").exists():
                _run(self._ip, "link", "del", veth, check=False)
        if self._made_bridge:
            _run(self._ip, "link", "del", self.bridge, check=False)
        self._made_ns, self._made_veths, self._made_bridge = [], [], False


def _tbf_args(rate: str) -> list[str]:
    # Burst: at least 1 ms of traffic (timer granularity) and a few 64 KiB GSO segments, else
    # tbf cannot reach the rate; the queue holds 50 ms before it drops.
    burst = max(int(parse_rate(rate) / 8 * 1e-3), 256 * 1024)
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def _end_processes_in(ip: str, ns: str) -> None:
    """Processes still inside one of our namespaces (ours: started there by this run) keep it alive
    after ``ip netns del``; end them by pid."""
    pids = [int(p) for p in _run(ip, "netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if pid_alive(p)]
            time.sleep(0.05)
        if not pids:
            return


_netem: bool | None = None


def netem_available() -> bool:
    """Whether this kernel has sch_netem (probed once, on a dummy device in a scratch namespace)."""
    global _netem
    if _netem is None:
        ip, tc = ip_binary(), tc_binary()
        if ip is None or tc is None or os.geteuid() != 0:
            _netem = False
        else:
            ns = f"{PREFIX}-{os.getpid():x}probe"
            try:
                _run(ip, "netns", "add", ns)
                _run(ip, "-n", ns, "link", "set", "lo", "up")
                _netem = (
                    _run(tc, "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", check=False).returncode
                    == 0
                )
            except subprocess.CalledProcessError:
                _netem = False
            finally:
                _run(ip, "netns", "del", ns, check=False)
    return _netem


def remove_stale() -> list[str]:
    """Delete namespaces and bridges this module made in runs whose process is gone; returns them.
    Never touches anything of a live process."""
    ip = ip_binary()
    if ip is None or os.geteuid() != 0:
        return []
    removed = []
    for line in _run(ip, "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.fullmatch(rf"{PREFIX}-([0-9a-f]+)x[0-9a-f]+-\d+|{PREFIX}-([0-9a-f]+)probe", name)
        dead = m is not None and not pid_alive(int(m.group(1) or m.group(2), 16))
        # A namespace that still holds processes is in use after all (pid reuse): leave it.
        if dead and not _run(ip, "netns", "pids", name, check=False).stdout.split():
            _run(ip, "netns", "del", name, check=False)
            removed.append(name)
    for dev in Path("/sys/class/net").iterdir():
        m = re.fullmatch(rf"{BRIDGE_PREFIX}([0-9a-f]+)x[0-9a-f]+", dev.name)
        if m and (dev / "bridge").exists() and not pid_alive(int(m.group(1), 16)):
            _run(ip, "link", "del", dev.name, check=False)
            removed.append(dev.name)
    return removed
