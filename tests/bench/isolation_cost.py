"""What each per-run isolation step of sandbox.py costs, in ms per run: a bare fork + exit + wait, then the same
with one step added (python tests/bench/isolation_cost.py [runs]). Root only (as the sandbox's steps are where
it runs as root). The steps are the calls sandbox.py makes, in the same process shape: a server that is pid 1 of
its own PID and mount namespaces, forking a child that exits at once.

  pid     a random pid for the run (write ns_last_pid)
  ns      the child drops to another uid, enters a user + IPC namespace, joins a new session keyring
  cgroup  peak reset, usage read, limit write; the child joins the cgroup; the peak read back
  tmpfs   the run directory is a tmpfs mounted for the run and unmounted after it
  stack   as tmpfs, but each run's tmpfs is covered by the next one's and the stack unmounted 32 at a time (what
          sandbox.py does: an unmount waits for an RCU grace period, so one per 32 runs, not one per run)
  netns   as ns, plus a network namespace of the run's own (what sandbox.py does where it lacks /proc/self/net;
          else it renews the worker's only after a run that left a socket)
  pidns   as netns, plus PID and mount namespaces per run (one more fork: the run is pid 1 of its own)
  runcg   a memory, a pids and a cpuacct cgroup made for the run, joined, and removed after it
          (sandbox.py keeps the pids and cpuacct ones, reset, and makes the memory one anew)
  unixgc  after the run a unix socket is made and closed, which runs the kernel's unix garbage collector
          (it frees descriptor loops a run left); no loop exists here, the common case
  seccomp the bare fork once this process has sandbox.py's system-call filter, which every child inherits (what a
          worker does: it installs the filter once). Measured after the other steps (a filter cannot be removed)

Not a test (not collected); numbers vary with the machine's load: steps are measured interleaved, in rounds,
and the median of the rounds is printed. Ends with one line: RESULT all_wall_ms=... all_cpu_ms=... (every step
together, over the bare fork) seccomp_wall_ms=... seccomp_cpu_ms=... (the filter alone, over the bare fork).
"""
import ctypes
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import sandbox  # noqa: E402  (its filter, built once at import as in the fork server)

libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWUSER, NEWPID, NEWNET, NEWIPC = 0x20000, 0x10000000, 0x20000000, 0x40000000, 0x08000000
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}[os.uname().machine]


def check(ret, what):
    if ret != 0:
        raise OSError(ctypes.get_errno(), what)


def main(runs):
    if os.geteuid() != 0:
        sys.exit("root only: the steps measured are those sandbox.py takes as root")
    check(libc.unshare(NEWNS | NEWNET | NEWPID), "unshare")
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    check(libc.mount(None, b"/", None, ctypes.c_ulong(16384 | (1 << 18)), None), "make / private")
    last_pid = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY)
    with open("/proc/self/cgroup") as f:
        ours = next(ln.split(":", 2)[2].strip() for ln in f if "memory" in ln.split(":")[1].split(","))
    cg = f"/sys/fs/cgroup/memory{ours}/corecode-isolation-cost-{os.getpid()}"
    os.mkdir(cg)
    procs, limit, max_usage, usage = (os.open(f"{cg}/{n}", m) for n, m in (
        ("cgroup.procs", os.O_WRONLY), ("memory.limit_in_bytes", os.O_WRONLY),
        ("memory.max_usage_in_bytes", os.O_RDWR), ("memory.usage_in_bytes", os.O_RDONLY)))
    v1 = {c: f"/sys/fs/cgroup/{c}" + next(ln.split(":", 2)[2].strip() for ln in open("/proc/self/cgroup")
                                          if c in ln.split(":")[1].split(",")) for c in ("memory", "cpuacct", "pids")}
    scratch = "/tmp/corecode-isolation-cost"
    os.makedirs(scratch + "/run", exist_ok=True)
    stack = scratch + "/stack"
    os.makedirs(stack + "/run", exist_ok=True)
    check(libc.mount(stack.encode(), stack.encode(), None, ctypes.c_ulong(4096), None), "bind the stack's base")
    stacked = [0]

    def one(step):
        if step in ("pid", "all"):
            os.pwrite(last_pid, b"%d" % (300 + int.from_bytes(os.urandom(2), "little")), 0)
        if step in ("cgroup", "all"):
            os.pwrite(max_usage, b"0", 0)
            start = int(os.pread(usage, 64, 0))
            os.pwrite(limit, b"%d" % (start + (256 << 20)), 0)
        if step in ("tmpfs", "stack", "all"):
            where = f"{stack if step != 'tmpfs' else scratch}/run".encode()
            check(libc.mount(b"tmpfs", where, b"tmpfs", ctypes.c_ulong(6), b"size=256m,nr_inodes=8192"), "mount tmpfs")
        if step in ("runcg", "all"):
            run_cg = []
            for c, base in v1.items():
                d = f"{base}/corecode-isolation-cost-run-{os.getpid()}"
                os.mkdir(d)
                run_cg.append((d, os.open(f"{d}/cgroup.procs", os.O_WRONLY)))
            limit_fd = os.open(f"{v1['memory']}/corecode-isolation-cost-run-{os.getpid()}/memory.limit_in_bytes",
                               os.O_WRONLY)
            os.write(limit_fd, b"%d" % (256 << 20))
            os.close(limit_fd)
        p = os.fork()
        if p == 0:
            if step in ("cgroup", "all"):
                os.write(procs, b"0")
            if step in ("runcg", "all"):
                for _, fd in run_cg:
                    os.write(fd, b"0")
            if step == "netns":
                check(libc.unshare(NEWUSER | NEWIPC | NEWNET), "unshare user + IPC + net")
            if step == "pidns":
                check(libc.unshare(NEWUSER | NEWIPC | NEWNET | NEWPID | NEWNS), "unshare all")
                if os.fork() == 0:
                    os._exit(0)
                os.wait()
            if step in ("ns", "all"):
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                check(libc.unshare(NEWUSER | NEWIPC), "unshare user + IPC")
                if libc.syscall(SYS_KEYCTL, 1, None) < 0:
                    os._exit(3)
            os._exit(0)
        _, status = os.waitpid(p, 0)
        assert status == 0, (step, status)
        if step in ("cgroup", "all"):
            int(os.pread(max_usage, 64, 0))
        if step in ("runcg", "all"):
            for d, fd in run_cg:
                os.close(fd)
                os.rmdir(d)
        if step in ("unixgc", "all"):
            fd = libc.socket(1, 1 | os.O_CLOEXEC, 0)
            os.close(fd)
        if step == "tmpfs":
            check(libc.umount2(f"{scratch}/run".encode(), 2), "umount tmpfs")
        if step in ("stack", "all"):
            os.statvfs(f"{stack}/run")
            stacked[0] += 1
            if stacked[0] == 32:
                check(libc.umount2(stack.encode(), 2), "umount the stack")
                check(libc.mount(stack.encode(), stack.encode(), None, ctypes.c_ulong(4096), None), "bind the base")
                stacked[0] = 0

    def cpu():
        return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                             resource.RUSAGE_CHILDREN)))

    def measure(step, name=None):
        t0, c0 = time.perf_counter(), cpu()
        for _ in range(runs):
            one(step)
        wall[name or step].append((time.perf_counter() - t0) / runs * 1e3)
        used[name or step].append((cpu() - c0) / runs * 1e3)

    steps = ["base", "pid", "ns", "netns", "pidns", "cgroup", "runcg", "tmpfs", "stack", "unixgc", "all", "seccomp"]
    wall, used = {s: [] for s in steps}, {s: [] for s in steps}
    for _ in range(7):
        for step in steps[:-1]:
            measure(step)
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    sandbox._install_seccomp()
    for _ in range(7):
        measure("base", "seccomp")
    # CPU = this process + its reaped children (user + sys); the kernel's deferred work (freeing namespaces after an
    # RCU grace period, in kernel threads) is in neither figure.
    extra = {}
    for step in steps:
        w, c = statistics.median(wall[step]), statistics.median(used[step])
        extra[step] = (w - statistics.median(wall["base"]), c - statistics.median(used["base"]))
        print(f"{step:7s} wall {w:6.3f} ms/run ({extra[step][0]:+.3f})   CPU {c:6.3f} ms/run ({extra[step][1]:+.3f})")
    os.rmdir(cg)
    check(libc.umount2(stack.encode(), 2), "umount the stack")
    print(f"RESULT all_wall_ms={extra['all'][0]:.3f} all_cpu_ms={extra['all'][1]:.3f} "
          f"seccomp_wall_ms={extra['seccomp'][0]:.3f} seccomp_cpu_ms={extra['seccomp'][1]:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
