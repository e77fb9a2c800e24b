"""Hosts as Linux network namespaces on one machine, for the end-to-end launch tests (`make e2e`).

Every host is a network namespace with one veth interface named `eth0` (DeepSpeed's OpenMPI runner
passes `--mca btl_tcp_if_include eth0`) on a bridge that lives in a namespace of its own, so nothing
touches the machine's real network. A "holder" process per host (`ip netns exec NS unshare --uts
--mount`) owns the host's hostname and its private mounts: a copy of /etc (its own hosts, passwd,
ssh configuration), and its own /home, /tmp and mount points such as /app. Everything a test runs on a
host enters the holder's namespaces with nsenter, as root or as the image's user (UID 1001).

Teardown is by PID and by namespace name: every process still in a host's network namespace is killed
(SIGTERM, then SIGKILL), the namespaces are deleted, and mount points this module created are removed.
Requires root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the `ip`, `unshare` and `nsenter` tools.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

USER = "deepspeed"
UID = 1001  # the image's user (workloads/images/deepspeed/Dockerfile), as the chart runs every container
HOME = f"/home/{USER}"
SUBNET = "10.233.77"  # a private /24 inside the bridge namespace only
# Directories each host sees as its own: /etc (copied), /home and /tmp (empty).
PRIVATE_DIRS = ("etc", "home", "tmp")
# The checkout the hosts run the image's files from. A clone under /tmp or /home would be hidden by the host's
# private /tmp or /home: it is bound into the private directory first, and that directory mounted recursively.
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Termination:
    """What stopping a pod as the kubelet does came to."""

    hook_output: str  # what the preStop hook printed
    main_exited: bool  # the main process ended on SIGTERM within the grace period (False: the kubelet's SIGKILL)
    killed: int  # processes left when the main process was gone, SIGKILLed as the kernel does


@dataclass
class Host:
    name: str  # the host's hostname (pod name)
    aliases: tuple[str, ...]  # other names resolving to it (the headless-service FQDNs of the hostfiles)
    ip: str
    netns: str
    root: Path  # the host's private files: etc/, home/, tmp/ and extra mount sources
    holder: subprocess.Popen[bytes] | None = None
    # The pod's main process (its container's PID 1 on a cluster): what the kubelet signals, and only that.
    main: subprocess.Popen[bytes] | None = None

    @property
    def home(self) -> Path:
        """The image user's home as seen from outside the host."""
        return self.root / "home" / USER

    def path(self, inside: str) -> Path:
        """Where a path of the host's private /etc, /home or /tmp lies outside the host."""
        parts = Path(inside).parts
        if len(parts) < 2 or parts[1] not in PRIVATE_DIRS:
            raise ValueError(f"{inside} is not under a private directory of {self.name}")
        return self.root.joinpath(*parts[1:])


@dataclass
class Cluster:
    """Network-namespace hosts joined by a bridge; use as a context manager (teardown on exit)."""

    work: Path
    names: Sequence[tuple[str, tuple[str, ...]]]
    shared_mounts: Mapping[str, Path] = field(default_factory=dict)  # mount point -> source, on every host
    prefix: str = field(default_factory=lambda: f"dse2e{os.getpid() % 100000}")
    hosts: list[Host] = field(default_factory=list)
    _namespaces: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # --- set-up -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o755)
        _ip("netns", "add", self.bridge_ns)
        self._namespaces.append(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for index, (name, aliases) in enumerate(self.names):
            host = Host(name, aliases, f"{SUBNET}.{10 + index}", f"{self.prefix}-{index}",
                        self.work / "hosts" / name)
            self.hosts.append(host)
            self._add_netns(host, index)
        for host in self.hosts:
            self._prepare_files(host)
        for host in self.hosts:
            self._start_holder(host)

    def _add_netns(self, host: Host, index: int) -> None:
        _ip("netns", "add", host.netns)
        self._namespaces.append(host.netns)
        port = f"p{index}"
        _ip("link", "add", port, "netns", self.bridge_ns, "type", "veth", "peer", "name", "eth0",
            "netns", host.netns)
        _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")

    def hosts_file(self) -> str:
        lines = ["127.0.0.1 localhost"]
        lines += [" ".join([h.ip, h.name, *h.aliases]) for h in self.hosts]
        return "\n".join(lines) + "\n"

    def _prepare_files(self, host: Host) -> None:
        host.root.mkdir(parents=True, exist_ok=True)
        etc = host.root / "etc"
        if etc.exists():
            shutil.rmtree(etc)
        # A private copy of the machine's /etc (a few MB): the host's own hostname, hosts, passwd, ssh
        # configuration, while the real /etc never changes. No private key of the machine goes in.
        shutil.copytree("/etc", etc, symlinks=True, ignore=shutil.ignore_patterns("ssh_host_*", "shadow*"))
        (etc / "hostname").write_text(host.name + "\n")
        (etc / "hosts").write_text(self.hosts_file())
        # The image's user: password field "*" (no password, not locked: sshd without PAM refuses a
        # locked account even for keys), a real shell, home /home/deepspeed.
        _drop_lines(etc / "passwd", f"{USER}:", f"x:{UID}:")
        _drop_lines(etc / "group", f"{USER}:", f"x:{UID}:")
        with open(etc / "passwd", "a") as handle:
            handle.write(f"{USER}:*:{UID}:{UID}:DeepSpeed:{HOME}:/bin/bash\n")
        with open(etc / "group", "a") as handle:
            handle.write(f"{USER}:x:{UID}:\n")
        (etc / "shadow").write_text(f"root:*:19000:0:99999:7:::\n{USER}:*:19000:0:99999:7:::\n")
        os.chmod(etc / "shadow", 0o640)
        home = host.root / "home"
        tmp = host.root / "tmp"
        for directory in (home, tmp):
            if directory.exists():
                shutil.rmtree(directory)
        (home / USER / ".ssh").mkdir(parents=True)
        os.chmod(home / USER / ".ssh", 0o700)
        _chown_tree(home / USER, UID)
        tmp.mkdir()
        os.chmod(tmp, 0o1777)

    def fresh_homes(self) -> None:
        """An empty home for the image's user and an empty /tmp on every host (each launch path brings its own
        ~/.ssh and host keys, as a new pod would)."""
        keep = _repo_entry("tmp")
        for host in self.hosts:
            for item in (host.root / "tmp").iterdir():
                if item.name == keep:  # where the holder binds the checkout (a clone under /tmp): never removed
                    continue
                if item.is_dir() and not item.is_symlink():
                    shutil.rmtree(item, ignore_errors=True)
                else:
                    item.unlink(missing_ok=True)
            shutil.rmtree(host.home, ignore_errors=True)
            (host.home / ".ssh").mkdir(parents=True)
            os.chmod(host.home / ".ssh", 0o700)
            _chown_tree(host.home, UID)

    def _start_holder(self, host: Host) -> None:
        ready = host.root / "ready"
        ready.unlink(missing_ok=True)
        mounts = []
        for d in PRIVATE_DIRS:
            if REPO.is_relative_to(f"/{d}"):
                inside = host.root / d / REPO.relative_to(f"/{d}")
                inside.mkdir(parents=True, exist_ok=True)
                mounts.append(f"mount --bind {REPO} {inside}")
            mounts.append(f"mount --rbind {host.root / d} /{d}")
        for point, source in self.shared_mounts.items():
            self._mount_point(Path(point))
            mounts.append(f"mount --bind {source} {point}")
        script = "; ".join(["set -e", f"hostname {host.name}", *mounts, f"touch {ready}", "exec sleep infinity"])
        host.holder = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount", "--propagation", "private",
             "bash", "-c", script],
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not ready.exists():
            if host.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host {host.name}: namespace set-up failed (exit {host.holder.poll()})")
            time.sleep(0.05)

    def _mount_point(self, point: Path) -> None:
        """A mount point the image has (/app, /job, /gcs): created empty when absent, and left there. Removing it
        at the end detached every bind mount on it in other runs' hosts (since Linux 3.18 an rmdir of a mount
        point in another mount namespace unmounts it there): two `make e2e` runs on one machine (CI beside a
        session's, or two sessions') lost their bucket mid-run (vLLM: "Repo id must be in the form ..." for a
        /gcs folder that had been there)."""
        point.mkdir(parents=True, exist_ok=True)

    def bind(self, host: Host, source: Path, point: str) -> None:
        """Mount `source` at `point` inside one host only (a pod's own volume)."""
        self._mount_point(Path(point))
        self.run(host, ["mount", "--bind", str(source), point], user=False, timeout=10, check=True)

    # --- running things ----------------------------------------------------------------------------

    def command(self, host: Host, argv: Sequence[str], *, user: bool = True,
                env: Mapping[str, str] | None = None) -> list[str]:
        """argv run inside `host` (its network, UTS and mount namespaces), as UID 1001 by default, with
        exactly the environment given (plus HOME, USER, LOGNAME for the user)."""
        assert host.holder is not None
        enter = ["nsenter", "--target", str(host.holder.pid), "--net", "--uts", "--mount"]
        if user:
            enter += ["--setuid", str(UID), "--setgid", str(UID)]
        base = {"HOME": HOME, "USER": USER, "LOGNAME": USER} if user else {"HOME": "/root"}
        base["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        variables = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
        workdir = HOME if user else "/"
        return [*enter, "--", "env", "-i", f"--chdir={workdir}", *variables, *argv]

    def run(self, host: Host, argv: Sequence[str], *, user: bool = True, env: Mapping[str, str] | None = None,
            timeout: float, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(host, argv, user=user, env=env), capture_output=True, text=True,
                              timeout=timeout, check=check, stdin=subprocess.DEVNULL)

    def spawn(self, host: Host, argv: Sequence[str], *, log: Path, user: bool = True,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A background process in `host`, output to `log`; stopped by stop_services or teardown."""
        with open(log, "ab") as out:
            return subprocess.Popen(self.command(host, argv, user=user, env=env), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def spawn_main(self, host: Host, argv: Sequence[str], *, log: Path,
                   env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """The pod's main process (as the image's user), remembered as `host.main` for terminate_pod."""
        host.main = self.spawn(host, argv, log=log, env=env)
        return host.main

    def pids(self, host: Host) -> list[int]:
        """Every process in the host's network namespace except its holder."""
        out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=False)
        holder = host.holder.pid if host.holder else -1
        return [int(p) for p in out.stdout.split() if p.strip().isdigit() and int(p) != holder]

    def signal_host(self, host: Host, signum: int, pids: Iterable[int] | None = None) -> list[int]:
        sent = []
        for pid in (self.pids(host) if pids is None else pids):
            try:
                os.kill(pid, signum)
                sent.append(pid)
            except ProcessLookupError:
                pass
        return sent

    def terminate_pod(self, host: Host, grace: float,
                      pre_stop: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Termination:
        """What the kubelet does to a pod it stops (preemption, drain, eviction), and nothing more: run the
        container's preStop hook (`pre_stop`, inside the host as the image's user) and wait for it, then SIGTERM
        to the container's main process only (`host.main`: each exec keeps its PID), all within
        `grace` seconds; SIGKILL when the grace period ends. Every other process of the host stands for the rest
        of the container's PID namespace: the kernel SIGKILLs those when the main process exits (or when the
        kubelet's SIGKILL ends it), whatever they were doing."""
        main = host.main
        assert main is not None, f"{host.name} has no main process"
        deadline = time.monotonic() + grace
        hook_output = ""
        if pre_stop:
            try:
                done = self.run(host, pre_stop, env=env, timeout=grace)
                hook_output = (done.stdout + done.stderr).strip()
            except subprocess.TimeoutExpired:
                hook_output = f"preStop still running after {grace:.0f} s"
        main.send_signal(signal.SIGTERM)
        main_exited = True
        try:
            main.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            main_exited = False
            main.kill()
            main.wait(timeout=5)
        left = self.signal_host(host, signal.SIGKILL)  # the PID namespace's init is gone: the kernel kills the rest
        _wait_gone(lambda: self.pids(host), 5)
        return Termination(hook_output=hook_output, main_exited=main_exited, killed=len(left))

    def stop_job(self, pods: Sequence[tuple[Host, float, Sequence[str] | None]],
                 env: Mapping[str, str] | None = None) -> list[Termination]:
        """A whole-job stop as Kubernetes does it (`kubectl delete mpijob`, Kueue's preemption or eviction: the
        operator deletes the launcher and the workers together): every pod (host, its grace period, its preStop
        command or None) stopped as terminate_pod does, all starting at the same moment, each SIGKILLed when its
        own grace period ends. Returns their Terminations in the order given."""
        with ThreadPoolExecutor(max_workers=len(pods)) as pool:
            stops = [pool.submit(self.terminate_pod, host, grace, pre_stop, env) for host, grace, pre_stop in pods]
            return [stop.result() for stop in stops]

    def stop_services(self, grace: float = 3) -> None:
        """Every process on every host, holders excepted (between scenarios)."""
        for host in self.hosts:
            self.signal_host(host, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(self.pids(h) for h in self.hosts):
            time.sleep(0.1)
        for host in self.hosts:
            self.signal_host(host, signal.SIGKILL)
            _wait_gone(lambda host=host: self.pids(host), 5)

    # --- teardown ----------------------------------------------------------------------------------

    def teardown(self) -> None:
        for host in self.hosts:
            if any(ns == host.netns for ns in self._namespaces):
                self.signal_host(host, signal.SIGKILL)
            if host.holder is not None and host.holder.poll() is None:
                host.holder.kill()
                host.holder.wait(timeout=10)
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self._namespaces.clear()


def _repo_entry(private_dir: str) -> str | None:
    """The first path component of the checkout inside /<private_dir>, when the checkout lies there."""
    return REPO.relative_to(f"/{private_dir}").parts[0] if REPO.is_relative_to(f"/{private_dir}") else None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=10)
    if result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _drop_lines(path: Path, *prefixes_or_fields: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not any(line.startswith(p) or p in line for p in prefixes_or_fields)]
    path.write_text("".join(kept))


def _chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, uid)
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def _wait_gone(pids: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and pids():  # type: ignore[operator]
        time.sleep(0.1)


def preflight() -> str | None:
    """Why network-namespace hosts cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "not root: network namespaces, veth pairs and bind mounts need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"dse2e-probe-{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if result.returncode:
        return f"network namespaces are not permitted here ({result.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None
